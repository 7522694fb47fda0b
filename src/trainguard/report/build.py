"""The report's content, independent of its format: verdict, timeline, findings, plots, checks, environment.

`build_report` reads a run folder once and returns a `Report`; `markdown.py` and `html.py` render it.
Everything here is plain data, so both formats say the same thing.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from trainguard.errors import UserError
from trainguard.findings import Finding, most_severe_first
from trainguard.folderio import checked_subdir, read_head, read_tail
from trainguard.report.checks import Check, build_checks
from trainguard.report.load import RunData, load_run
from trainguard.report.plots import build_plots, samples_per_step
from trainguard.report.svg import Plot
from trainguard.report.timeline import Row, build_timeline
from trainguard.store.status import shown_state

OUTPUT_TAIL = 40  # lines of output.log shown


@dataclass
class Verdict:
    state: str
    started: float | None
    ended: float | None
    duration: float | None
    steps_done: int | None
    steps_planned: int | None
    exit_code: int | None
    signal: str | None
    headline: str  # one sentence: the first error finding, or what a clean run did
    health: str = "ok"  # ok | warning | error: what the findings say, beside how the process ended


@dataclass
class Report:
    run_dir: Path
    verdict: Verdict
    timeline: list[Row]
    findings: list[Finding]
    plots: list[Plot]
    checks: list[Check]
    environment: list[tuple[str, str]]
    output_tail: list[str] = field(default_factory=list)
    stacks: list[tuple[str, str]] = field(default_factory=list)  # (file name, text) from stacks/
    title: str = ""  # the script's label and the run folder
    numbers: list[tuple[str, str]] = field(default_factory=list)  # the key numbers, as a seed's metrics table


def build_report(run_dir: str | Path) -> Report:
    data = load_run(run_dir)
    return Report(
        run_dir=data.run_dir,
        verdict=build_verdict(data),
        timeline=build_timeline(data),
        findings=most_severe_first(list(data.findings)),
        plots=build_plots(data),
        checks=build_checks(data),
        environment=build_environment(data),
        output_tail=_output_tail(data.run_dir),
        stacks=_stacks(data.run_dir),
        title=data.title,
        numbers=key_numbers(data),
    )


def key_numbers(data: RunData) -> list[tuple[str, str]]:
    """The table a post-mortem starts with: where the loss ended, the LR, the speed, the evaluations."""
    out: list[tuple[str, str]] = []
    steps = data.columns.get("step")

    def last_and_best(label: str, col: Any) -> None:
        if col is None or not col.any or steps is None:
            return
        ok = col.present & np.isfinite(col.values)
        bad = int((col.present & ~np.isfinite(col.values)).sum())
        recorded = np.flatnonzero(col.present)
        if ok.any():
            vals, at = col.values[ok], steps.values[ok]
            tail = vals[-max(min(10, len(vals)), len(vals) // 100):]  # the last 1% (>= 10 steps): not one noisy step
            i = int(np.argmin(vals))
            last_i = recorded[-1]
            if not np.isfinite(col.values[last_i]):
                # a run that ended in NaN ends in NaN: the last finite value is not where it ended
                last = (f"last {col.values[last_i]} at step {int(steps.values[last_i])} (the last finite value"
                        f" {vals[-1]:.4g} at step {int(at[-1])}; mean of the {len(tail)} finite steps before it"
                        f" {tail.mean():.4g})")
            else:
                first = int(at[-len(tail)])
                span = int(at[-1]) - first + 1
                # values recorded every N steps (a printed log): the mean is of the last values, spanning more
                # steps than there are values (a new user read "the last 10 steps" of a log printed every 50);
                # steps that went back (a resumed log) get no range
                which = (f"the last {len(tail)} steps" if span == len(tail) else
                         f"the last {len(tail)} values, steps {first}-{int(at[-1])}" if span > len(tail) else
                         f"the last {len(tail)} values")
                last = f"last {vals[-1]:.4g} (mean of {which} {tail.mean():.4g})"
            out.append((label, f"{last}; lowest {vals[i]:.4g} at step {int(at[i])}" +
                        (f"; {bad} non-finite" if bad else "")))
        elif bad:
            out.append((label, f"non-finite at all {bad} recorded steps"))

    last_and_best("loss" + (" (as printed by the command)" if "loss" in data.printed else ""), data.col("loss"))
    for k, c in data.parts.items():
        last_and_best(f"loss part {k}", c)
    lr = data.col("lr")
    if lr is not None:
        ok = lr.present & np.isfinite(lr.values)
        if ok.any():
            v = lr.values[ok]
            out.append(("learning rate", f"first {v[0]:.3g}, peak {v.max():.3g}, last {v[-1]:.3g}"))
    st = data.col("step_time")
    if st is not None:
        v = st.values[st.present & np.isfinite(st.values) & (st.values > 0)]
        if len(v):
            per_step, unit = samples_per_step(data.meta)
            q25, med, q75 = np.percentile(v, [25, 50, 75])
            out.append(("step time", f"median {med * 1000:.3g} ms (IQR {q25 * 1000:.3g}-{q75 * 1000:.3g} ms); "
                                     f"{per_step / med:.4g} {unit}"))
    evals: dict[str, list[tuple[int, float]]] = {}
    for e in data.events_of("eval"):
        if isinstance(e["data"], dict):
            for k, v in e["data"].items():
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    evals.setdefault(k, []).append((e["step"], float(v)))
    for k, pts in evals.items():
        out.append((f"eval {k}", f"last {pts[-1][1]:.4g} at step {pts[-1][0]}; {len(pts)} evaluations, "
                                 f"range {min(p[1] for p in pts):.4g}-{max(p[1] for p in pts):.4g}"))
    job = scheduler_line(data.status.get("scheduler") or data.meta.get("scheduler"))
    if job:
        out.append(("job", job))
    return out


def scheduler_line(sched: Any) -> str | None:
    """The job a run ran in: "slurm job 4182 on tgn1, time limit 1:00:00, ends 2026-12-06 04:05, restarts 1"."""
    if not isinstance(sched, dict) or not sched.get("job_id"):
        return None
    parts = [f"{sched.get('name', 'job')} job {sched['job_id']}"]
    if sched.get("array_task"):
        parts[0] += f"_{sched['array_task']}"
    if sched.get("node"):
        parts[0] += f" on {sched['node']}"
    limit = sched.get("time_limit_s")
    if isinstance(limit, (int, float)):
        parts.append(f"time limit {int(limit) // 3600}:{int(limit) % 3600 // 60:02d}:{int(limit) % 60:02d}")
    if isinstance(sched.get("end"), (int, float)):
        parts.append("ends " + time.strftime("%Y-%m-%d %H:%M", time.localtime(sched["end"])))
    if sched.get("restarts"):
        parts.append(f"restarts {sched['restarts']}")
    if sched.get("ended_by"):
        parts.append(f"ended by the scheduler: {sched['ended_by']}")
    return ", ".join(str(p) for p in parts)


def build_verdict(data: RunData) -> Verdict:
    st = data.status
    state = (shown_state(st) if st.get("state") else None) or ("unknown (no status.json)" if not st else "?")
    started = st.get("started") or _num(data.meta.get("started"))
    ends = [e for e in data.events if e["kind"] == "run" and e["name"] == "end"]
    ended = st.get("ended") or (ends[-1]["t"] if ends else None)
    if started is None and data.t_range:
        started = data.t_range[0]
    if ended is None and data.t_range and state != "running":
        ended = data.t_range[1]
    duration = (ended - started) if (isinstance(started, (int, float)) and isinstance(ended, (int, float))) else None
    # the watchdog measures the run's length by the monotonic clock: a wall clock set back mid-run made
    # ended - started negative; a negative one from an older run is not shown at all
    measured = st.get("duration")
    if isinstance(measured, (int, float)) and not isinstance(measured, bool) and 0 <= measured < 1e10:
        duration = float(measured)
    elif duration is not None and duration < 0:
        duration = None
    steps = data.columns.get("step")
    done = st.get("step")
    if done is None and steps is not None and steps.any:
        done = int(np.nanmax(steps.values))
    planned = st.get("total_steps") or (data.meta.get("plan") or {}).get("total_steps")
    from trainguard.store.acks import read_acks
    from trainguard.store.status import health_of

    # an acknowledged finding (`trainguard ack`) stays listed, but neither the headline nor the health
    acks = read_acks(data.run_dir)
    open_ = [f for f in data.findings if f.code not in acks]
    acked = len(data.findings) - len(open_)
    errors = [f for f in open_ if f.severity == "error"]
    if errors:
        first = min(errors, key=lambda f: (f.t if f.t is not None else float("inf"), f.step or 0))
        headline = sentence(first)
    elif open_:
        headline = (f"No errors; {len(open_)} other finding(s), the first: "
                    f"{sentence(most_severe_first(list(open_))[0])}")
    elif acked:
        headline = f"No open findings; {acked} acknowledged (see Findings)."
    else:
        headline = "No findings: every check that this run's data allows passed (see 'What was checked')."
    if acked and open_:
        headline += f" ({acked} acknowledged finding(s) apart.)"
    health = health_of({"state": state, "findings": [{**f.to_dict(), "acked": f.code in acks} for f in data.findings]})
    return Verdict(state, started, ended, duration, done, planned, st.get("exit_code"), st.get("signal"), headline,
                   health)


def sentence(f: Finding) -> str:
    at = f" at step {f.step}" if f.step is not None else ""
    where = f" ({f.where})" if f.where else ""
    text = f"{f.code} {f.name}{at}: {f.summary}{where}"
    return text if text.endswith(".") else text + "."


def _node_rows(data: RunData) -> list[tuple[str, str]]:
    """One row per node part of a merged run folder: its state, last step, exit code and command."""
    from trainguard.store.nodes import node_dirs, node_of
    from trainguard.store.reader import RunReader

    nodes = data.status.get("nodes")
    per_node: dict[str, Any] = nodes if isinstance(nodes, dict) else {}
    rows = []
    for part in node_dirs(data.run_dir):
        node = node_of(part)
        st = per_node.get(str(node)) or {}
        try:
            with RunReader(part) as reader:
                cmd = reader.meta().get("command")
        except UserError:
            cmd = None
        said = [str(st.get("state") or "unknown")]
        if st.get("step") is not None:
            said.append(f"step {st['step']}")
        if st.get("exit_code") is not None:
            said.append(f"exit code {st['exit_code']}")
        if isinstance(cmd, list):
            said.append("command: " + " ".join(str(c) for c in cmd))
        rows.append((f"node {node}", ", ".join(said)))
    return rows


def build_environment(data: RunData) -> list[tuple[str, str]]:
    m = data.meta
    env: list[tuple[str, str]] = []

    def add(key: str, value: Any) -> None:
        text = value if isinstance(value, str) else _compact(value) if value is not None else ""
        if text:
            env.append((key, text))

    cmd = m.get("command") or data.status.get("command")
    nodes = _node_rows(data)
    if nodes:  # a run over nodes: each node's own command and ending, not only the lowest node's
        env.extend(nodes)
    else:
        add("command", " ".join(str(c) for c in cmd) if isinstance(cmd, list) else cmd)
    add("cwd", m.get("cwd"))
    add("run folder", str(data.run_dir))
    add("host", m.get("host"))
    add("user", m.get("user"))
    if m.get("started"):
        add("started", clock(m["started"]))
    wd = m.get("watchdog") or {}
    add("trainguard", wd.get("trainguard"))
    add("python", wd.get("python"))
    add("platform", wd.get("platform"))
    for key in sorted(k for k in m if k.startswith("probe.")):
        p = m[key] or {}
        if isinstance(p, dict):
            add(f"{key} (rank {key.split('.', 1)[1]})",
                ", ".join(f"{k} {p[k]}" for k in ("python", "torch", "trainguard", "pid") if p.get(k)))
            for gk in ("gpu", "device", "cuda"):
                add(f"{gk} (rank {key.split('.', 1)[1]})", p.get(gk))
    for gk in ("gpu", "device", "cuda", "gpus"):
        add(gk, m.get(gk))
    add("environment", m.get("env"))
    add("plan", m.get("plan"))
    add("config", m.get("config"))
    if wd:
        add("watchdog options", {k: wd[k] for k in ("stall_timeout", "expects", "on_hang") if k in wd})
    return env


def _compact(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k}={_short(v)}" for k, v in value.items() if v not in (None, "", [], {}))
    if isinstance(value, list):
        return ", ".join(_short(v) for v in value)
    return _short(value)


def _short(v: Any) -> str:
    return f"{v:.6g}" if isinstance(v, float) else str(v)


def clock(t: Any) -> str:
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(t)))
    except (TypeError, ValueError, OverflowError, OSError):  # OSError: EOVERFLOW, a time past the year 2^31
        return str(t)


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) else None


def _output_tail(run_dir: Path) -> list[str]:
    path = run_dir / "output.log"
    if not os.path.lexists(path):
        return []
    # its end only, never through a link, never a FIFO or a device (UserError: one line, exit 2)
    text = read_tail(path, 16384, "output.log").decode("utf-8", errors="replace")
    return text.splitlines()[-OUTPUT_TAIL:]


def _stacks(run_dir: Path) -> list[tuple[str, str]]:
    """The stack dumps the watchdog saved at a hang (stacks/hang-*.txt first, then per-process dumps)."""
    folder = checked_subdir(run_dir / "stacks")  # a link in its place: one line, exit 2
    if folder is None:
        return []
    try:
        files = sorted(p for p in folder.iterdir() if p.suffix == ".txt" and not p.name.startswith("."))
    except OSError:
        return []
    files.sort(key=lambda p: not p.name.startswith("hang-"))
    out = []
    for path in files[:4]:
        text = read_head(path, 20000, "stack dump").decode("utf-8", errors="replace")
        if text.strip():  # a process that was never asked for a dump leaves an empty file
            out.append((path.name, text))
    return out


def evidence_rows(evidence: dict[str, Any]) -> list[tuple[str, str, Any]]:
    """(key, "value" | "block", text or lines) for each evidence entry: numbers inline, stacks as blocks."""
    rows: list[tuple[str, str, Any]] = []
    for key, v in (evidence or {}).items():
        if isinstance(v, float):
            text = clock(v) if key.endswith("_at") and v > 1e9 else f"{v:.6g}"
            rows.append((key, "value", text))
        elif isinstance(v, (int, bool)) or v is None:
            rows.append((key, "value", str(v)))
        elif isinstance(v, str):
            rows.append((key, "block", v.splitlines()) if "\n" in v or len(v) > 160 else (key, "value", v))
        elif isinstance(v, list):
            lines = [_frame_line(x) if isinstance(x, dict) else _short(x) for x in v]
            scalars = all(isinstance(x, (int, float, str, bool)) or x is None for x in v)
            if (len(lines) <= 1 or scalars) and len(", ".join(lines)) < 160 and all("\n" not in x for x in lines):
                rows.append((key, "value", ", ".join(lines) or "(none)"))
            else:
                rows.append((key, "block", lines[:200]))
        elif isinstance(v, dict):
            flat = all(isinstance(x, (int, float, str, bool)) or x is None for x in v.values())
            text = _compact(v) if flat else ""
            if flat and len(text) < 160:
                rows.append((key, "value", text or "(none)"))
            else:
                import json

                rows.append((key, "block", json.dumps(v, indent=1, default=str).splitlines()[:200]))
        else:
            rows.append((key, "value", str(v)))
    return rows


def _frame_line(x: dict[str, Any]) -> str:
    if "file" in x and "line" in x:
        code = f": {x['code']}" if x.get("code") else ""
        return f"{x['file']}:{x['line']} in {x.get('function', '?')}{code}"
    return _compact(x)


def fmt_duration(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds) or abs(seconds) > 1e11:
        return "unknown"  # (a damaged store's times: infinite, or thousands of years apart)
    seconds = max(0.0, float(seconds))
    if seconds < 120:
        return f"{seconds:.1f} s"
    h, rem = divmod(int(seconds), 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m} min {s} s"


def elapsed(t: float | None, started: float | None) -> str:
    if t is None or started is None:
        return ""
    return "+" + fmt_duration(t - started)
