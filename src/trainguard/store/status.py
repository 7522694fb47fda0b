"""status.json: the small, always-current summary of a run, for orchestrators and people.

The contract (names fixed): `state` in {running, hung, completed, failed, crashed, killed}, `step`,
`phase`, `exit_code`, `signal`, and `findings` (each with code, name, severity, step, summary,
evidence, fix; crash findings also exception and where). More fields are welcome, never fewer.

`health` in {ok, warning, error} stands beside `state`: `state` says how the process ended, `health`
what the run's findings say about it. A run that exited 0 with its LR at zero is `completed` and
`error`; a run that did not end well (failed, crashed, killed, hung) is always `error`. It is derived
from the rest at every write (and on reading a status.json written before it existed).

It is written atomically (a temp file renamed over the old one) so a reader never sees half a file.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from trainguard.errors import UserError

STATUS_NAME = "status.json"
STATES = ("running", "hung", "completed", "failed", "crashed", "killed")


def write_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    """Write `text` to `path` so that a reader (a poller, a browser refreshing a page) never sees half of it:
    a temp file beside it, renamed over it."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, mode)  # mkstemp makes it private; these files are for reading
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


HEALTHS = ("ok", "warning", "error")
BAD_ENDS = ("failed", "crashed", "killed", "hung")


def health_of(status: dict[str, Any]) -> str:
    """ok | warning | error: the worst of the findings' severities, error for a run that did not end well."""
    if status.get("state") in BAD_ENDS:
        return "error"
    severities = {f.get("severity") for f in status.get("findings") or [] if isinstance(f, dict)}
    return "error" if "error" in severities else "warning" if "warning" in severities else "ok"


def health_counts(status: dict[str, Any]) -> str:
    """`error (2 errors, 1 warning)`: the health word with what it rests on, for one line of output."""
    found = [f for f in status.get("findings") or [] if isinstance(f, dict)]
    errors = sum(f.get("severity") == "error" for f in found)
    warnings = sum(f.get("severity") == "warning" for f in found)
    parts = [f"{errors} error{'s' if errors != 1 else ''}" if errors else "",
             f"{warnings} warning{'s' if warnings != 1 else ''}" if warnings else ""]
    detail = ", ".join(p for p in parts if p)
    health = status.get("health") or health_of(status)
    return f"{health} ({detail})" if detail else health


def write_status(run_dir: str | Path, status: dict[str, Any]) -> None:
    status = {**status, "health": health_of(status)}
    write_atomic(Path(run_dir) / STATUS_NAME, json.dumps(status, indent=2, default=str) + "\n")


def read_status(run_dir: str | Path) -> dict[str, Any]:
    path = Path(run_dir) / STATUS_NAME
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
        raise UserError(f"cannot read {path}: {exc}") from None
    if not isinstance(data, dict):
        raise UserError(f"{path} is not a trainguard status (a JSON object is expected, found {type(data).__name__})")
    if data.get("health") not in HEALTHS:
        data["health"] = health_of(data)  # written before `health` existed, or by hand
    return data
