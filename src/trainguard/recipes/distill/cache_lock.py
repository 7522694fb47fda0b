"""One build per cache folder at a time: an fcntl advisory lock on `.build.lock` inside it.

Two builds into one folder would each write the manifest and race on the same shard names; the second
is refused in one line naming the holder's PID (written into the lock file by the holder). The lock
goes with the process: a killed build leaves a file nobody holds, and the next build takes it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from trainguard.errors import UserError

LOCK_NAME = ".build.lock"


@contextlib.contextmanager
def build_lock(folder: Path) -> Iterator[None]:
    path = folder / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as exc:
        raise UserError(f"cache: cannot open the build lock {path}: {exc.strerror}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
            raise UserError(f"cache: another build (PID {holder}) is writing {folder}; wait for it to end "
                            "or build into another --out") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock
