"""The preflight's scratch working folder, and what the script wrote outside it.

The script runs in `RUN/scratch/root/<parent>/<folder>/`, a mirror of the folder the user ran `trainguard
preflight` from (real folders, a symlink per file) below mirrors of its two parents (a symlink per
entry), so relative paths (data, configs, modules, `../data`) resolve as they would in the real run. Writes never go through those symlinks: the probe's write watch (probe/fastforward.py) turns a
symlink into a private copy before a Python write to it, so a preflight checkpoint lands in the scratch
folder and the user's files and configs stay untouched. What the watch cannot see (native code, child
processes) is caught by comparing the user's folder before and after.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from trainguard.store.paths import temporary_dirs

SKIP = {".git", ".hg", ".venv", "venv", "__pycache__", "node_modules", ".mypy_cache", ".pytest_cache",
        ".ruff_cache", "trainguard-runs"}
MIRROR_LIMIT = 5_000  # entries mirrored as real folders and file symlinks; past this, folders are linked whole
SNAPSHOT_LIMIT = 20_000  # files compared before/after; past this the comparison is partial (and says so)


PARENT_LEVELS = 2  # `../data` and `../../shared` resolve as in the user's folder; `../../../x` does not


def build_scratch(origin: Path, scratch: Path, avoid: list[Path]) -> Path:
    """Creates under `scratch` the folder the script runs in, and returns it: a mirror of `origin` (real
    folders, a symlink for each file; caches and the run folder left out), placed so that the script's
    view of the file system is the user's: it sits at `scratch/root/<parent's name>/<origin's name>`, and
    each of the PARENT_LEVELS folders above it holds a symlink to every other entry of the user's folder
    at that level. `../data` then reaches the user's `../data` (read through the link; a write there is
    outside the scratch folder, watched and listed as any other), `../proj/x` comes back into the mirror.

    Why real folders: a new file written by native code (safetensors bound before the probe could wrap
    it, a C++ logger) then lands in the scratch folder too; only an overwrite of an existing file by
    native code goes through to the user's file, and the before/after comparison reports it. Past
    MIRROR_LIMIT entries (a dataset folder), folders are linked whole.
    """
    scratch.mkdir(parents=True, exist_ok=True)
    avoid_real = [os.path.realpath(p) for p in avoid]
    budget = [MIRROR_LIMIT]

    def mirror(src: Path, dst: Path) -> None:
        for entry in sorted(src.iterdir()):
            if entry.name in SKIP:
                continue
            real = os.path.realpath(entry)
            if any(a == real or a.startswith(real + os.sep) for a in avoid_real):
                continue  # the run folder lives in it: linking it would make the scratch folder contain itself
            target = dst / entry.name
            if target.exists() or target.is_symlink():
                continue
            budget[0] -= 1
            if entry.is_dir() and not entry.is_symlink() and budget[0] > 0:
                target.mkdir()
                mirror(entry, target)
            else:
                target.symlink_to(real)

    # levels[0] is the user's folder, levels[-1] the highest parent mirrored; path[i] is levels[i]'s place
    # in the scratch tree (scratch/root/<name of levels[-2]>/.../<name of levels[0]>)
    levels = [origin, *list(origin.parents)[:PARENT_LEVELS]]
    path = [scratch / "root"]
    for below in reversed(levels[:-1]):
        path.insert(0, path[0] / below.name)
    path[0].mkdir(parents=True, exist_ok=True)
    mirror(origin, path[0])
    for i in range(1, len(levels)):  # each folder above: its other entries linked, the way down a real folder
        try:
            entries = sorted(levels[i].iterdir())
        except OSError:
            continue  # a parent the user cannot list: `..` there reads nothing, as it would not for them
        for entry in entries:
            real = os.path.realpath(entry)
            if entry.name == levels[i - 1].name or entry.name in SKIP:
                continue
            if any(a == real or a.startswith(real + os.sep) for a in avoid_real):
                continue  # the run folder lives in it: linking it would make the scratch folder contain itself
            target = path[i] / entry.name
            if not (target.exists() or target.is_symlink()):
                target.symlink_to(real)
    return path[0]


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


def own_output_files() -> set[tuple[int, int]]:
    """(device, inode) of the regular files trainguard's own stdout and stderr go to.

    `trainguard preflight -- python train.py > preflight.log` inside the work folder: the shell opened
    that file for trainguard, which writes the script's echoed output into it. It changes during the
    preflight, but the script did not write it, and the real run will not resume from it.
    """
    own = set()
    for fd in (1, 2):
        try:
            st = os.fstat(fd)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            own.add((st.st_dev, st.st_ino))
    return own


def is_own_output(path: str, own: set[tuple[int, int]]) -> bool:
    try:
        st = os.stat(path)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) in own


def without_fresh_temp(writes: list[dict[str, str]]) -> list[dict[str, str]]:
    """The writes less the folders the script made with tempfile.mkdtemp() and what it wrote into them: a
    fresh, randomly named folder is the script's own scratch, which the real run never finds again."""
    fresh = [w["path"] + os.sep for w in writes if w.get("op") == "mkdtemp"]
    return [w for w in writes if w.get("op") != "mkdtemp" and not any(w["path"].startswith(f) for f in fresh)]


def is_temporary(path: str, origin: str | None = None) -> bool:
    """A path in a temp or cache folder. With `origin` (the user's folder): not where the user's folder
    itself lies under that temp folder and the path is in it (a project under /tmp keeps its files), but
    yes where the temp folder lies inside the user's folder (TMPDIR=./tmp: still temporary)."""
    for t in temporary_dirs():
        if path.startswith(t + os.sep):
            mine = origin is not None and path.startswith(origin.rstrip(os.sep) + os.sep) \
                and (origin.rstrip(os.sep) + os.sep).startswith(t + os.sep)
            if not mine:
                return True
    return False
