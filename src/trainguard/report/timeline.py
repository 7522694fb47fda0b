"""The run's timeline: start, phases, evaluations, checkpoints, restarts, findings and the end.

Only what tells the run's story: the rules' own bookkeeping (a parameter checksum every few steps, contract
observations: `contract.INTERNAL_EVENT_KINDS`) stays in the store for the rules and out of the timeline.

Rows come from the store's events and the findings. A long run has thousands of phase and eval events;
past `MAX_ROWS` each repeated kind keeps its first and last few rows and says how many it left out, so
the timeline of a million-step run still reads in a minute.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainguard.contract import EVENT_CHECKPOINT_CHECK, EVENT_DEVICE, INTERNAL_EVENT_KINDS
from trainguard.findings import Finding
from trainguard.report.load import RunData
from trainguard.store.ending import how_it_exited

MAX_ROWS = 80
KEEP_EACH = 5  # first and last rows kept of each repeated (kind, name) when the timeline is long
ALWAYS = ("run", "crash", "finding", "restart", "probe")


@dataclass
class Row:
    t: float | None
    step: int | None
    attempt: int
    kind: str
    what: str
    severity: str = ""
    group: str = ""  # rows of one group are alike (every 'eval' phase begin): long runs elide within it


def build_timeline(data: RunData) -> list[Row]:
    rows: list[Row] = []
    ranks = len({e.get("rank") for e in data.events if e["kind"] == "probe"})
    for e in data.events:
        row = _event_row(e, ranks)
        if row is not None:
            rows.append(row)
    for f in data.findings:
        rows.append(Row(f.t, f.step, 0, "finding", _finding_text(f), f.severity))
    rows.sort(key=lambda r: (r.t if r.t is not None else float("inf")))
    return _elide(rows)


def _event_row(e: dict[str, Any], ranks: int) -> Row | None:
    kind, name, d = e["kind"], e["name"], e["data"] if isinstance(e["data"], dict) else {}
    attempt = e.get("attempt") or 0
    if kind == "finding":
        return None  # shown from the findings themselves, once each
    if kind == "run":
        if name == "start":
            what = "run started" + (f" (restart, attempt {d.get('attempt')})" if d.get("attempt") else "")
            what += f", pid {d['pid']}" if d.get("pid") else ""
        elif name == "end":
            what = f"run ended: {d.get('state', '?')}"
            how = how_it_exited(d.get("state"), d.get("exit_code"), d.get("signal"))
            what += f" ({how})" if how else ""
        else:
            what = f"run {name}"
        return Row(e["t"], e["step"], d.get("attempt", attempt) or attempt, "run", what)
    if kind == "phase":
        edge = d.get("edge", "")
        what = f"phase '{name}' {'begins' if edge == 'begin' else 'ends'}"
        if edge == "end" and isinstance(d.get("seconds"), (int, float)):
            what += f" after {d['seconds']:.1f} s"
        if edge == "begin" and d.get("nth"):
            what += f" (#{d['nth']})"
        return Row(e["t"], e["step"], attempt, "phase", what, group=f"phase:{name}:{edge}")
    if kind == "eval":
        metrics = ", ".join(f"{k} {_num(v)}" for k, v in d.items())
        return Row(e["t"], e["step"], attempt, "eval", f"evaluation: {metrics}")
    if kind == "checkpoint":
        size = f" ({d['bytes'] / 2**20:.1f} MiB)" if isinstance(d.get("bytes"), (int, float)) else ""
        return Row(e["t"], e["step"], attempt, "checkpoint", f"checkpoint saved: {name}{size}")
    if kind == EVENT_CHECKPOINT_CHECK:
        return _check_row(e, d, attempt)
    if kind == EVENT_DEVICE:
        return _device_row(e, d, attempt)
    if kind == "crash":
        return Row(e["t"], e["step"], attempt, "crash", f"exception {name}: {str(d.get('message', ''))[:200]}", "error")
    if kind == "probe":
        rank = e.get("rank")
        of = f" (rank {rank})" if isinstance(rank, int) and rank >= 0 and ranks > 1 else ""  # one row per rank
        return Row(e["t"], e["step"], attempt, "probe", f"probe {name}{of}")
    if kind in INTERNAL_EVENT_KINDS or kind in ("memory", "resources"):
        return None  # the rules' bookkeeping (kept in the store for them), samples that are plotted
    text = f"{kind} {name or ''}".strip()
    if d:
        text += ": " + ", ".join(f"{k}={_num(v)}" for k, v in list(d.items())[:6])
    return Row(e["t"], e["step"], attempt, kind, text[:300])


def _check_row(e: dict[str, Any], d: dict[str, Any], attempt: int) -> Row:
    """A checkpoint's verification (checkpoints/verifier.py): its verdict, what it found and what it cost."""
    status = str(d.get("status") or "?")
    head = {"verified": "checkpoint verified", "unverified": "checkpoint not verified"}.get(
        status, f"checkpoint {status.upper()}")
    cost = f"; {d['wall_s']:.1f} s" if isinstance(d.get("wall_s"), (int, float)) else ""
    seen = "" if d.get("reported", True) else " (seen written, not reported)"
    severity = "error" if status in ("poisoned", "unloadable", "step-mismatch", "unchanged") else ""
    return Row(e["t"], e["step"], attempt, "checkpoint", f"{head}: {e['name']}{seen}: {str(d.get('why', ''))[:200]}{cost}",
               severity)


def _device_row(e: dict[str, Any], d: dict[str, Any], attempt: int) -> Row:
    """What a GPU or the kernel said (devices/): an Xid, ECC, a throttle, a kernel-log line."""
    rank = e.get("rank")
    who = f" (rank {rank})" if isinstance(rank, int) and rank >= 0 else ""
    return Row(e["t"], e["step"], attempt, "device", f"device{who}: {str(d.get('text') or e['name'])[:240]}",
               "error" if d.get("serious") else "")


def _finding_text(f: Finding) -> str:
    return f"{f.code} {f.name}: {f.summary}"


def _num(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)[:60]


def _elide(rows: list[Row]) -> list[Row]:
    if len(rows) <= MAX_ROWS:
        return rows
    groups: dict[tuple, list[int]] = {}
    for i, r in enumerate(rows):
        if r.kind in ALWAYS:
            continue
        key = (r.kind, r.group)
        groups.setdefault(key, []).append(i)
    drop: dict[int, int] = {}  # index of the first dropped row -> how many were dropped after it
    dropped: set[int] = set()
    for idx in groups.values():
        if len(idx) > 2 * KEEP_EACH:
            middle = idx[KEEP_EACH:-KEEP_EACH]
            dropped.update(middle)
            drop[middle[0]] = len(middle)
    out = []
    for i, r in enumerate(rows):
        if i in drop:
            out.append(Row(r.t, r.step, r.attempt, r.kind, f"… {drop[i]} more like this, left out"))
        if i not in dropped:
            out.append(r)
    return out
