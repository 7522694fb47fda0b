"""Bytes the run writes to its files, as progress: a save that keeps writing is working, however slowly.

    writes = WriteWatch(exclude=run_dir)
    t = writes.poll(pid)        # the time the run was last seen writing to a file, or None

Read from the kernel's file table of every process of the run (psutil `open_files`: path, fd, offset):
a file open for writing whose offset grew since the last look, or that is new and already holds bytes,
was written; a megabyte written since the last mark makes a new one. The run folder is left out: the probe writes its store there all the time, alive or not.
Pipes and sockets are not files here; output lines are counted by the tee. Reading the file table costs a
few milliseconds per process, so it is read at most every `every` seconds.
"""

from __future__ import annotations

import collections
import os
import time
from pathlib import Path
from typing import Any

EVERY = 2.0  # seconds between reads of the file table
# A mark needs this many bytes written since the last one: a save moves megabytes, while a thread that
# appends a line to a log now and then (a heartbeat, a metrics service) would otherwise hide a real hang.
MARK_BYTES = 1 << 20
MAX_FILES = 4096  # a process with more open files than this is not read (the cost would grow with it)


class WriteWatch:
    def __init__(self, exclude: str | os.PathLike, every: float = EVERY) -> None:
        self.exclude = str(Path(exclude).resolve()) + os.sep
        self.every = every
        self.last_write: float | None = None
        self._offsets: dict[tuple[int, int, str], int] = {}
        self._last_poll = 0.0
        self._off = False
        self._pending = 0  # bytes written since the last mark
        # files seen open for writing that are no longer open: written and closed (a checkpoint saved), for
        # the checkpoint verification (watchdog/ckptwatch.py); bounded, newest kept
        self.closed: collections.deque[str] = collections.deque(maxlen=64)

    @property
    def open_paths(self) -> set[str]:
        """The paths open for writing at the last read of the file table."""
        return {path for (_, _, path) in self._offsets}

    def take_closed(self) -> list[str]:
        """Files closed since the last call (each once)."""
        out = list(self.closed)
        self.closed.clear()
        return out

    def poll(self, pid: int) -> float | None:
        """Reads the file table when due; returns the last time a write was seen (None: never)."""
        now = time.time()
        if self._off or now - self._last_poll < self.every:
            return self.last_write
        self._last_poll = now
        try:
            offsets = self._read(pid)
        except ImportError:
            self._off = True  # psutil missing: output and the probe remain the signs of progress
            return self.last_write
        self._pending += sum(max(0, pos - self._offsets.get(key, 0)) for key, pos in offsets.items())
        if self._pending >= MARK_BYTES:
            self.last_write, self._pending = now, 0
        still = {path for (_, _, path) in offsets}
        self.closed.extend(sorted({path for (_, _, path) in self._offsets} - still))
        self._offsets = offsets
        return self.last_write

    def _read(self, pid: int) -> dict[tuple[int, int, str], int]:
        import psutil

        out: dict[tuple[int, int, str], int] = {}
        try:
            root = psutil.Process(pid)
            procs = [root, *root.children(recursive=True)]
        except (psutil.Error, OSError):
            return out
        for proc in procs:
            try:
                if proc.num_fds() > MAX_FILES:
                    continue
                files: list[Any] = proc.open_files()
            except (psutil.Error, OSError):
                continue
            for f in files:
                mode = getattr(f, "mode", "w")
                position = getattr(f, "position", None)
                if mode == "r" or position is None or f.path.startswith(self.exclude):
                    continue
                out[(proc.pid, f.fd, f.path)] = int(position)
        return out
