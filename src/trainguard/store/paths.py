"""Where run folders live and how a user names one.

A run folder is made by `trainguard run` (and handed to the script through TRAINGUARD_RUN_DIR) or, when
a script runs alone, by the probe under ./trainguard-runs/. A user names a run by its path, by its
folder name under the runs root, or not at all (the newest).
"""

from __future__ import annotations

import os
import re
import tempfile
import time
from pathlib import Path

from trainguard.contract import ENV_RUNS_ROOT
from trainguard.errors import UserError
from trainguard.folderio import check_run_dir
from trainguard.store.nodes import node_dirs
from trainguard.store.schema import DB_NAME

DEFAULT_ROOT = "trainguard-runs"


def runs_root() -> Path:
    return Path(os.environ.get(ENV_RUNS_ROOT, DEFAULT_ROOT))


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-")[:40] or "run"


def new_run_dir(label: str, root: str | Path | None = None) -> Path:
    """A fresh, unique run folder under `root` (default ./trainguard-runs), created now."""
    base = Path(root) if root is not None else runs_root()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for i in range(1000):
        suffix = "" if i == 0 else f"-{i}"
        path = base / f"{stamp}-{_slug(label)}{suffix}"
        try:
            path.mkdir(parents=True, exist_ok=False)
            return check_run_dir(path)
        except FileExistsError:
            continue
        except OSError as exc:
            raise UserError(f"cannot create run folder {path}: {exc.strerror or exc}") from None
    raise UserError(f"cannot find a free run folder name under {base}")


def prepare_run_dir(path: str | Path) -> Path:
    """Create (or reuse) a run folder the user named, checking that it is writable."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot create run folder {path}: {exc.strerror or exc}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise UserError(f"run folder {path} is not writable")
    return check_run_dir(path)  # the user's own, nothing planted in it (folderio.py)


def is_run_dir(path: Path) -> bool:
    # a run over nodes: its parts in node-<N>/ (store/nodes.py)
    return (path / DB_NAME).is_file() or (path / "status.json").is_file() or bool(node_dirs(path))


def list_runs(root: str | Path | None = None) -> list[Path]:
    base = Path(root) if root is not None else runs_root()
    if not base.is_dir():
        return []
    return sorted((p for p in base.iterdir() if p.is_dir() and is_run_dir(p)), key=lambda p: p.stat().st_mtime)


def resolve_run(name: str | None, root: str | Path | None = None) -> Path:
    """A run folder from a path, a folder name under the root, or None for the newest."""
    if name is None:
        runs = list_runs(root)
        if not runs:
            base = Path(root) if root is not None else runs_root()
            raise UserError(f"no runs found under {base}")
        return runs[-1]
    direct = Path(name)
    if direct.is_dir() and is_run_dir(direct):
        return direct
    base = Path(root) if root is not None else runs_root()
    under = base / name
    if under.is_dir() and is_run_dir(under):
        return under
    if direct.exists():
        raise UserError(f"{name} is not a trainguard run folder (no run.db or status.json in it)")
    raise UserError(f"unknown run: {name} (not a folder, and not a run under {base})")


def temporary_dirs() -> list[str]:
    """Temp and cache folders: written by libraries all the time, never resumed from by accident."""
    return [os.path.realpath(tempfile.gettempdir()), os.path.realpath(os.path.expanduser("~/.cache"))]
