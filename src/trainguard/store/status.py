"""status.json: the small, always-current summary of a run, for orchestrators and people.

The contract (names fixed, see trainguard/contract.py): `state` in {running, hung, completed, failed, crashed,
killed} (a writer cannot write another: `checked_status`), `step`,
`phase`, `exit_code`, `signal`, and `findings` (each with code, name, severity, step, summary,
evidence, fix; crash findings also exception and where). More fields are welcome, never fewer.
`owner` names the process that writes it; readers (`read_status`) show a live state whose owner is gone
as `abandoned` (see store/owner.py), never as `running`.

A preflight's verdict (passed, incomplete, failed) is the field `preflight_outcome`, beside the state of
the start it judged; readers show it in place of the state (`shown_state`).

`health` in {ok, warning, error} stands beside `state`: `state` says how the process ended, `health`
what the run's findings say about it. A run that exited 0 with its LR at zero is `completed` and
`error`; a run that did not end well (failed, crashed, killed, hung) is always `error`. It is derived
from the rest at every write (and on reading a status.json written before it existed).

It is written atomically (a temp file renamed over the old one) so a reader never sees half a file.
Its last word must be true even on a full disk: the owner of a run keeps a small reserve file beside
it (`reserve_space`) and gives it up for the final status when nothing else can be written.
"""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from trainguard.contract import STATUS_NAME, checked_status
from trainguard.errors import UserError
from trainguard.findings import escalations_merged
from trainguard.folderio import create_fresh, read_capped, write_atomic
from trainguard.store.acks import mark_acked, read_acks
from trainguard.untrusted import load_json

RESERVE_NAME = ".status.reserve"
RESERVE_BYTES = 256 * 1024  # room for a final status.json with its findings, kept while the run lives
_FULL = (errno.ENOSPC, errno.EDQUOT)
MAX_STATUS_BYTES = 64 << 20  # a status.json larger than this is damaged; reading it whole would cost the memory


HEALTHS = ("ok", "warning", "error")
BAD_ENDS = ("failed", "crashed", "killed", "hung", "abandoned")


def health_of(status: dict[str, Any]) -> str:
    """ok | warning | error: the worst of the findings' severities, error for a run that did not end well."""
    if status.get("state") in BAD_ENDS:
        return "error"
    # an acknowledged finding (store/acks.py) is known and accepted: it stays listed, outside the health
    severities = {f.get("severity") for f in status.get("findings") or [] if isinstance(f, dict) and not f.get("acked")}
    return "error" if "error" in severities else "warning" if "warning" in severities else "ok"


def health_counts(status: dict[str, Any]) -> str:
    """`error (2 errors, 1 warning)`: the health word with what it rests on, for one line of output."""
    found = [f for f in status.get("findings") or [] if isinstance(f, dict)]
    acked = sum(bool(f.get("acked")) for f in found)
    errors = sum(f.get("severity") == "error" and not f.get("acked") for f in found)
    warnings = sum(f.get("severity") == "warning" and not f.get("acked") for f in found)
    parts = [f"{errors} error{'s' if errors != 1 else ''}" if errors else "",
             f"{warnings} warning{'s' if warnings != 1 else ''}" if warnings else "",
             f"{acked} acknowledged" if acked else ""]
    detail = ", ".join(p for p in parts if p)
    health = status.get("health") or health_of(status)
    return f"{health} ({detail})" if detail else health


def strict_json(value: Any) -> Any:
    """`value` with every NaN and inf made JSON that any parser reads: the number becomes null and the
    dict holding it gains `<key>_nonfinite` ("nan", "inf" or "-inf"), so a NaN loss reads
    `"loss": null, "loss_nonfinite": "nan"`. (Python's json writes a bare NaN, which strict parsers reject.)"""
    if isinstance(value, float) and value - value != 0.0:
        return None
    if isinstance(value, dict):
        out: dict[Any, Any] = {}
        for key, item in value.items():
            if isinstance(item, float) and item - item != 0.0:
                out[key] = None
                out[f"{key}_nonfinite"] = "nan" if item != item else "inf" if item > 0 else "-inf"
            else:
                out[key] = strict_json(item)
        return out
    if isinstance(value, (list, tuple)):
        return [strict_json(item) for item in value]
    return value


def write_status(run_dir: str | Path, status: Mapping[str, Any], *, final: bool = False,
                 pause: Callable[[], None] | None = None) -> None:
    """Writes status.json (strict JSON: see `strict_json`); with `final`, a full disk gives up the run's
    reserve (see `reserve_space`). A state outside the contract is refused (ValueError). `pause`, when
    given, is called between making the text and writing the file (the probe's background thread passes
    its pacing: the two are its longest stretches of Python while the run trains)."""
    data: dict[str, Any] = dict(status)
    checked_status(data)
    if isinstance(data.get("findings"), list):  # a rule's warning and its later error: one entry
        data["findings"] = mark_acked(escalations_merged([f for f in data["findings"] if isinstance(f, dict)]),
                                      read_acks(run_dir))
    data["health"] = health_of(data)
    plain = json.loads(json.dumps(data, default=str))  # what json makes of it, NaN still a float
    text = json.dumps(strict_json(plain), indent=2, allow_nan=False) + "\n"
    if pause is not None:
        pause()
    path = Path(run_dir) / STATUS_NAME
    try:
        write_atomic(path, text)
    except OSError as exc:
        if not (final and exc.errno in _FULL and release_space(run_dir)):
            raise
        write_atomic(path, text)
    if final:
        release_space(run_dir)


def shown_state(status: dict[str, Any]) -> str:
    """The word a person reads for a run: a preflight's outcome (passed, incomplete, failed), else the state."""
    outcome = status.get("preflight_outcome")
    return outcome if isinstance(outcome, str) else str(status.get("state", "?"))


def reserve_space(run_dir: str | Path) -> bool:
    """Sets aside RESERVE_BYTES beside status.json, so that the final status can be written on a disk that
    the run filled. Fail-open: False when there is no room even now."""
    path = Path(run_dir) / RESERVE_NAME
    try:
        # made fresh (O_EXCL after removing what was there): a planted link is never written through
        with os.fdopen(create_fresh(path), "wb") as fh:
            fh.write(b"\0" * RESERVE_BYTES)  # written, not truncated: a sparse file would reserve nothing
            fh.flush()
            os.fsync(fh.fileno())
        return True
    except OSError:
        release_space(run_dir)
        return False


def release_space(run_dir: str | Path) -> bool:
    """Removes the reserve; True when there was one."""
    try:
        os.unlink(Path(run_dir) / RESERVE_NAME)
        return True
    except OSError:
        return False


def read_status(run_dir: str | Path) -> dict[str, Any]:
    path = Path(run_dir) / STATUS_NAME
    if not os.path.lexists(path):
        from trainguard.store.nodes import merged_status

        return merged_status(run_dir)  # a run over nodes: each node's part in node-<N>/ ({} when none)
    try:
        data = load_json(read_capped(path, MAX_STATUS_BYTES, "status.json"))
    except ValueError as exc:  # UnicodeDecodeError is a ValueError
        raise UserError(f"cannot read {path}: {exc}") from None
    if not isinstance(data, dict):
        raise UserError(f"{path} is not a trainguard status (a JSON object is expected, found {type(data).__name__})")
    from trainguard.store.owner import check_owner

    data = check_owner(_shaped(data))
    acks = read_acks(run_dir)  # acknowledged since status.json was last written (after the run, say)
    if acks:
        data["findings"] = mark_acked(data["findings"], acks)
    derived = health_of(data)  # written before `health` existed, or since abandoned by its owner
    if data.get("health") not in HEALTHS or HEALTHS.index(derived) > HEALTHS.index(data["health"]) or acks:
        data["health"] = derived
    return data


_NUMBERS = ("step", "total_steps", "exit_code", "pid", "started", "updated", "ended", "attempt", "duration")


def _shaped(data: dict[str, Any]) -> dict[str, Any]:
    """A damaged or hand-edited status.json shaped so that every reader can rely on the types it documents:
    fields of the wrong type are dropped (a finding that is not an object, a step that is not a number)."""
    out = dict(data)
    if not isinstance(out.get("state"), str):
        out["state"] = "unknown (status.json holds no state)" if "state" not in out else "unknown (bad state)"
    for key in _NUMBERS:
        value = out.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not -1e18 < value < 1e18):
            out.pop(key)
    findings = out.get("findings")
    out["findings"] = [f for f in findings if isinstance(f, dict)] if isinstance(findings, list) else []
    for key, kind in (("command", list), ("owner", dict), ("phase", str), ("signal", str), ("state_note", str)):
        if key in out and out[key] is not None and not isinstance(out[key], kind):
            out.pop(key)
    if isinstance(out.get("command"), list):
        out["command"] = [str(c) for c in out["command"]]
    return out
