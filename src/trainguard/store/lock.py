"""A run owns its folder: an advisory lock held for the run's life, and an earlier run kept apart.

Two `trainguard run --run-dir SAME` at once used to both write one run.db (600 rows for 300 steps, two
verdicts in one status.json); a run into a finished folder took over the old run's findings. Now:

- the owner of a run (the watchdog; the probe when a script runs alone) takes `RUN/.lock` with flock
  before it writes anything, and holds it until its process ends (the kernel lets go of it then, even on
  a SIGKILL: no stale lock to clean). The keeper of an attempt inherits the descriptor, so a watchdog
  killed mid-run leaves its folder owned while the command still writes it;
- a second run into a folder whose lock is held is refused in one line (exit 2) that names the holder's
  pid and host, read from the lock file;
- a new run into a folder that holds an earlier, ended run moves that run's files into `earlier-<N>/`
  beside it first (a run folder of its own: `trainguard status RUN/earlier-1` reads it), so the new
  verdict is the new run's alone and nothing of the old one is lost.

flock, not fcntl's record locks: a record lock is dropped when the process closes *any* descriptor of the
file (a report reading it would release it); flock belongs to the open file itself. On NFS, Linux
emulates flock with a record lock on the whole file, which holds across hosts.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import stat
import time
from pathlib import Path

from trainguard.errors import UserError
from trainguard.folderio import RUN_FILES, RUN_FOLDERS

LOCK_NAME = ".lock"
EARLIER = "earlier-{}"
_KEPT = (LOCK_NAME,)  # names that stay where they are when an earlier run is moved aside
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


class RunLock:
    """The held lock of one run folder; `fd` stays open (and locked) until `release` or the process ends."""

    def __init__(self, run_dir: Path, fd: int, moved_to: Path | None) -> None:
        self.run_dir, self.fd, self.moved_to = run_dir, fd, moved_to

    def release(self) -> None:
        if self.fd >= 0:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = -1


def claim(run_dir: str | Path, *, keep_apart: bool = True, command: list[str] | None = None) -> RunLock:
    """Takes the lock of `run_dir` for this process, or raises UserError naming the run that holds it.
    With `keep_apart`, an earlier run found in the folder is moved into earlier-<N>/ (see the module)."""
    run_dir = Path(run_dir)
    path = run_dir / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | _NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise UserError(f"cannot lock run folder {run_dir}: {path}: {exc.strerror or exc} "
                        f"(a link planted there is refused; remove it)") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UserError(f"cannot lock run folder {run_dir}: {path} is not a regular file (remove it)")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UserError(f"run folder {run_dir} is in use by another run ({_holder(fd)}): wait for it to "
                            f"end, or give this run another --run-dir") from None
        except OSError as exc:  # a file system without locks: say so rather than run unprotected silently
            raise UserError(f"cannot lock run folder {run_dir}: {exc.strerror or exc} (a file system without "
                            f"locks? give the run a folder on a local disk with --run-dir)") from None
        info = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(),
                "command": list(command or [])[:20]}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
        moved = move_earlier_run(run_dir) if keep_apart else None
    except BaseException:
        os.close(fd)
        raise
    return RunLock(run_dir, fd, moved)


def _holder(fd: int) -> str:
    try:
        raw = os.pread(fd, 4096, 0)
        info = json.loads(raw)
        pid, host = int(info["pid"]), str(info["host"])[:100]
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(info["started"])))
        return f"pid {pid} on {host}, since {since}"
    except (OSError, ValueError, KeyError, TypeError, OverflowError):
        return "its holder did not say which"


def held_by_other(run_dir: str | Path) -> bool:
    """True when another process holds the lock of `run_dir` (a reader's question; takes nothing)."""
    try:
        fd = os.open(Path(run_dir) / LOCK_NAME, os.O_RDONLY | _NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def move_earlier_run(run_dir: Path) -> Path | None:
    """Moves an earlier run's files (the names trainguard writes, nothing of the user's) into
    earlier-<N>/; returns that folder, or None when the folder held no run. Renames only: cheap and
    within one file system, links moved as links (never followed)."""
    present = [n for n in (*RUN_FILES, *RUN_FOLDERS) if n not in _KEPT and os.path.lexists(run_dir / n)]
    if not any(n in present for n in ("run.db", "status.json", "output.log")):
        return None
    for n in range(1, 10_000):
        dest = run_dir / EARLIER.format(n)
        try:
            os.mkdir(dest, 0o755)
            break
        except FileExistsError:
            continue
    else:
        raise UserError(f"run folder {run_dir} holds too many earlier runs: give this run another --run-dir")
    for name in present:
        try:
            os.rename(run_dir / name, dest / name)
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise UserError(f"cannot move the earlier run in {run_dir} aside ({name}: {exc.strerror or exc}): "
                            f"give this run another --run-dir") from None
    return dest
