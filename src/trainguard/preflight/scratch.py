"""The preflight's scratch working folder, and what the script wrote outside it.

The script runs in `RUN/scratch/`, which holds a symlink to each top-level entry of the folder the user
ran `trainguard preflight` from, so relative paths (data, configs, modules) resolve as they would in the
real run. Writes never go through those symlinks: the probe's write watch (probe/fastforward.py) turns a
symlink into a private copy before a Python write to it, so a preflight checkpoint lands in the scratch
folder and the user's files and configs stay untouched. What the watch cannot see (native code, child
processes) is caught by comparing the user's folder before and after.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

SKIP = {".git", ".hg", ".venv", "venv", "__pycache__", "node_modules", ".mypy_cache", ".pytest_cache",
        ".ruff_cache", "trainguard-runs"}
SNAPSHOT_LIMIT = 20_000  # files compared before/after; past this the comparison is partial (and says so)


def build_scratch(origin: Path, scratch: Path, avoid: list[Path]) -> Path:
    """Creates `scratch` with a symlink to each entry of `origin` (except caches and the run folder)."""
    scratch.mkdir(parents=True, exist_ok=True)
    avoid_real = [os.path.realpath(p) for p in avoid]
    for entry in sorted(origin.iterdir()):
        if entry.name in SKIP:
            continue
        real = os.path.realpath(entry)
        if any(a == real or a.startswith(real + os.sep) for a in avoid_real):
            continue  # the run folder lives in it: linking it would make the scratch folder contain itself
        link = scratch / entry.name
        if not link.exists() and not link.is_symlink():
            link.symlink_to(entry.resolve())
    return scratch


def snapshot(origin: Path, avoid: list[Path]) -> tuple[dict[str, tuple[int, int]], bool]:
    """(path -> (mtime_ns, size)) for the files under `origin`, and whether the walk was complete."""
    avoid_real = {os.path.realpath(p) for p in avoid}
    files: dict[str, tuple[int, int]] = {}
    for root, dirs, names in os.walk(origin):
        dirs[:] = [d for d in dirs if d not in SKIP and os.path.realpath(os.path.join(root, d)) not in avoid_real]
        for name in names:
            path = os.path.join(root, name)
            try:
                st = os.stat(path, follow_symlinks=False)
            except OSError:
                continue
            files[os.path.realpath(path)] = (st.st_mtime_ns, st.st_size)
            if len(files) >= SNAPSHOT_LIMIT:
                return files, False
    return files, True


def changed(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]) -> list[dict[str, str]]:
    """Files created, modified or deleted between two snapshots."""
    out = []
    for path, sig in after.items():
        if path not in before:
            out.append({"path": path, "op": "created"})
        elif before[path] != sig:
            out.append({"path": path, "op": "modified"})
    out.extend({"path": p, "op": "deleted"} for p in before if p not in after)
    return out


def outside_writes(start_dirs: list[Path]) -> list[dict[str, str]]:
    """What the probe's write watch listed, from every start of the script."""
    out: dict[str, dict[str, str]] = {}
    for d in start_dirs:
        path = d / "outside-writes.txt"
        if not path.is_file():
            continue
        for line in path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            out.setdefault(rec["path"], {"path": rec["path"], "op": rec.get("op", "write")})
    return list(out.values())


def is_temporary(path: str) -> bool:
    """Temp and cache folders: written by libraries all the time, never resumed from by accident."""
    temps = [os.path.realpath(tempfile.gettempdir()), os.path.realpath(os.path.expanduser("~/.cache"))]
    return any(path.startswith(t + os.sep) for t in temps)
