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


def write_status(run_dir: str | Path, status: dict[str, Any]) -> None:
    run_dir = Path(run_dir)
    fd, tmp = tempfile.mkstemp(prefix=".status.", suffix=".tmp", dir=run_dir)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(status, fh, indent=2, default=str)
            fh.write("\n")
        os.replace(tmp, run_dir / STATUS_NAME)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


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
