"""The preflight's write watch: copy on write inside the scratch folder, a list of everything written
outside it (probe/fastforward.py's "Writes" says what and why).

A Python audit hook watches files opened for writing (and `torch.save`/safetensors' `save_file`, which
open their files in native code, are wrapped to do the same). A write into the scratch folder through one
of its symlinks to the user's files first replaces the symlink by a private copy, so the preflight never
alters the user's files; a change to a file elsewhere that existed before is refused (`PreflightRefused`),
a new file elsewhere is listed in `outside-writes.txt` of the run folder, for the preflight's report.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

WRITES_FILE = "outside-writes.txt"
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
_installed = False
_busy = False
_watch: dict[str, Any] = {}  # the installed watch's own functions, for the savers wrapped later


class PreflightRefused(PermissionError):
    """A preflight write that would change a file that existed before, outside the scratch folder."""


def install_write_watch(scratch: Path, run_dir: Path, origin: str | None = None) -> None:
    """Installs (once per process) the audit hook that keeps the preflight's writes in its scratch folder.

    Inside the scratch folder a write through a symlink to the user's file gets a private copy first.
    Outside it (and outside the run folder, temp and cache folders and devices), a write that would
    change, replace or remove a file that existed before is refused with `PreflightRefused` (a
    PermissionError, raised into the script: the preflight never overwrites a user's file); a new file
    is let through and listed in `outside-writes.txt` for the report.
    """
    global _installed
    if _installed:
        return
    _installed = True
    scratch_s = os.path.abspath(scratch)
    scratch_real = os.path.realpath(scratch_s)
    run_s = os.path.realpath(run_dir)
    ignored = (run_s, "/dev/", "/proc/", "/sys/")
    listed: set[tuple[str, str]] = set()  # (path, operation) already written
    created: set[str] = set()  # files this preflight made outside the scratch folder: its own to rewrite
    # folders the script made with tempfile.mkdtemp(): fresh, randomly named, never found again by the real
    # run, so what it writes into them is its own scratch, not a file the real run could resume from
    fresh: list[str] = []
    out = os.path.join(run_s, WRITES_FILE)

    # Computed now, never inside the hook: tempfile.gettempdir() opens files under its own lock, and the
    # hook calling it again from there would wait on that lock forever.
    from trainguard.store.paths import temporary_dirs

    temps = tuple(t + os.sep for t in temporary_dirs())

    origin_s = os.path.realpath(origin) + os.sep if origin else None

    def outside(real: str) -> bool:
        if real.startswith(scratch_real + os.sep) or real.startswith(ignored):
            return False
        if origin_s and real.startswith(origin_s):
            return True  # the user's own folder, even where it lies under a temp folder
        return not real.startswith(temps)

    def record(path: str, what: str) -> None:
        # a rename, removal or mkdir acts on the entry itself (a symlink is not followed): its folder counts
        real = os.path.realpath(path) if what in ("write", "refused") else os.path.join(
            os.path.realpath(os.path.dirname(path)), os.path.basename(path))
        if real.startswith(scratch_real + os.sep) or real.startswith(ignored) \
                or "__pycache__" in real or (real, what) in listed or any(real.startswith(f) for f in fresh):
            return
        listed.add((real, what))
        with open(out, "a") as fh:
            fh.write(json.dumps({"path": real, "op": what, "t": time.time()}) + "\n")

    def check(path: str, follow: bool) -> None:
        """Refuses a change to a file outside the scratch folder that existed before the preflight."""
        real = os.path.realpath(path) if follow else os.path.join(os.path.realpath(os.path.dirname(path)),
                                                                  os.path.basename(path))
        if not outside(real):
            return
        if os.path.lexists(real) and real not in created and not os.path.isdir(real):
            record(path, "refused")
            raise PreflightRefused(
                f"trainguard preflight refused to change {real}: it existed before the preflight, which writes "
                f"only into its scratch folder ({scratch_s})")
        if not os.path.lexists(real):
            created.add(real)

    def hook(event: str, args: tuple) -> None:
        global _busy
        if _busy or event not in ("open", "os.rename", "os.replace", "os.mkdir", "os.remove", "os.rmdir"):
            return
        _busy = True
        try:
            if event == "open":
                path, mode, flags = args[0], args[1], args[2]
                if not isinstance(path, (str, bytes, os.PathLike)):
                    return
                writes = any(c in (mode or "") for c in "wax+") if mode else bool((flags or 0) & _WRITE_FLAGS)
                if not writes:
                    return
                path = os.path.abspath(os.fsdecode(path))
                _own_copy(path, scratch_s, append=bool(mode and ("a" in mode or "+" in mode)))
                check(path, follow=True)
                record(path, "write")
            else:
                path = os.path.abspath(os.fsdecode(args[1] if event in ("os.rename", "os.replace") else args[0]))
                if event == "os.mkdir" and _called_from_mkdtemp():
                    made = os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))
                    fresh.append(made + os.sep)
                    with open(out, "a") as fh:  # for the judge: what lands there (native writes too) is scratch
                        fh.write(json.dumps({"path": made, "op": "mkdtemp", "t": time.time()}) + "\n")
                    return
                _materialize(os.path.dirname(path), scratch_s)
                if event != "os.mkdir":
                    check(path, follow=False)
                record(path, event.split(".")[1])
        except PreflightRefused:
            raise  # the one exception an audit hook means to raise: the write does not happen
        except Exception:
            pass  # any other error in the hook would abort the user's own file operation
        finally:
            _busy = False

    sys.addaudithook(hook)
    _watch.update(scratch=scratch_s, record=record, check=check)
    wrap_savers()


def _called_from_mkdtemp() -> bool:
    """Whether the os.mkdir being audited is tempfile.mkdtemp's (its frame is a few above the hook's)."""
    frame: Any = sys._getframe(2)
    for _ in range(4):
        if frame is None:
            return False
        if frame.f_code.co_name == "mkdtemp" and frame.f_code.co_filename.endswith("tempfile.py"):
            return True
        frame = frame.f_back
    return False


def wrap_savers() -> None:
    """torch.save and safetensors' save_file open their files in C++ / Rust, unseen by the audit hook:
    wrapped here (for modules already imported; the bootstrap calls this again as they are imported)."""
    if not _watch:
        return
    for module, attr in (("torch.serialization", "save"), ("torch", "save"), ("safetensors.torch", "save_file")):
        mod = sys.modules.get(module)
        fn = getattr(mod, attr, None) if mod is not None else None
        if callable(fn) and not getattr(fn, "_trainguard_preflight", False):
            setattr(mod, attr, _guarded(fn))


def _guarded(save: Any) -> Any:
    def save_in_scratch(obj: Any, f: Any, *args: Any, **kwargs: Any) -> Any:
        global _busy
        if isinstance(f, (str, bytes, os.PathLike)) and not _busy:
            _busy = True  # our own unlink/mkdir below are not the script's writes
            try:
                path = os.path.abspath(os.fsdecode(f))
                _own_copy(path, _watch["scratch"], append=False)
                _watch["check"](path, True)
                _watch["record"](path, "write")
            except PreflightRefused:
                raise
            except Exception:
                pass
            finally:
                _busy = False
        return save(obj, f, *args, **kwargs)

    save_in_scratch.__wrapped__ = save  # type: ignore[attr-defined]
    save_in_scratch._trainguard_preflight = True  # type: ignore[attr-defined]
    return save_in_scratch


def _materialize(directory: str, scratch: str) -> None:
    """Turns each symlinked folder on the way from `scratch` to `directory` into a real folder of symlinks."""
    if not (directory + os.sep).startswith(scratch + os.sep):
        return
    current = scratch
    for part in Path(os.path.relpath(directory, scratch)).parts:
        if part in (".", ".."):
            return
        current = os.path.join(current, part)
        if os.path.islink(current) and os.path.isdir(current):
            target = os.path.realpath(current)
            os.unlink(current)
            os.mkdir(current)
            for entry in os.listdir(target):
                os.symlink(os.path.join(target, entry), os.path.join(current, entry))


def _own_copy(path: str, scratch: str, *, append: bool) -> None:
    """Before a write to a symlink in the scratch folder: replace it by a private file (copy on write)."""
    if not path.startswith(scratch + os.sep):
        return
    _materialize(os.path.dirname(path), scratch)
    if os.path.islink(path):
        target = os.path.realpath(path)
        os.unlink(path)
        if append and os.path.isfile(target):
            shutil.copyfile(target, path)
