"""status.json: the small, always-current summary of a run, for orchestrators and people.

The contract (names fixed): `state` in {running, hung, completed, failed, crashed, killed}, `step`,
`phase`, `exit_code`, `signal`, and `findings` (each with code, name, severity, step, summary,
evidence, fix; crash findings also exception and where). More fields are welcome, never fewer.

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


def write_status(run_dir: str | Path, status: dict[str, Any]) -> None:
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
    return data
