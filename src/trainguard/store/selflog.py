"""The guard's own log, `guard.log` in the run folder.

The guard's errors go here, never into the training loop. Errors are de-duplicated by kind (where they
happened and the exception's type, never the message, which often holds a temp name or a number that
changes every time): the first of a kind is written with its traceback, later ones are only counted.
The file is bounded: past MAX_BYTES nothing more is written, so a failure on every step cannot fill a disk.
Where guard.log cannot be written at all (a run folder gone read-only or deleted), a log made with
`stderr_fallback` (the probe's: the training's stderr is where its user looks) sends the same lines to
stderr instead, the first line of each and STDERR_LINES at most: said, never silently lost. The watchdog
has its own lines on the terminal for what matters and does not use it.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from pathlib import Path

from trainguard.folderio import open_append

LOG_NAME = "guard.log"
MAX_BYTES = 1 << 20  # guard.log stops growing here (all processes of the run together)
REPEAT_MARKS = (10, 100, 1000, 10000)  # a repeated kind is mentioned again at these counts
STDERR_LINES = 20  # where guard.log cannot be written, at most this many of its lines go to stderr


class GuardLog:
    def __init__(self, run_dir: str | Path, rank: int = 0, who: str | None = None, *,
                 stderr_fallback: bool = False) -> None:
        self.path = Path(run_dir) / LOG_NAME
        self.rank = rank
        self.who = who or f"pid={os.getpid()} rank={rank}"
        self._seen: dict[str, int] = {}
        self._lock = threading.Lock()
        self._full = False
        self.stderr_fallback = stderr_fallback
        self._stderr_lines = 0

    def write(self, message: str) -> None:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        try:
            with self._lock:
                if self._full:
                    return
                size = _size(self.path)
                line = f"{stamp} {self.who} {message}\n"
                if size + len(line) > MAX_BYTES - 512:  # the last 512 bytes are kept for the line below
                    self._full = True
                    line = f"{stamp} {self.who} guard.log reached its limit: nothing more is written\n"
                    if size + len(line) > MAX_BYTES:
                        return  # another process already said so
                with os.fdopen(open_append(self.path), "a") as fh:  # never through a planted link
                    fh.write(line)
        except OSError as exc:
            self._to_stderr(message, exc)

    def _to_stderr(self, message: str, exc: OSError) -> None:
        """guard.log cannot be written: stderr is where the user looks. Never raises."""
        from trainguard.untrusted import printable

        if not self.stderr_fallback or self._stderr_lines >= STDERR_LINES:
            return
        self._stderr_lines += 1
        why = f" (guard.log cannot be written: {exc.strerror or exc})" if self._stderr_lines == 1 else ""
        line = f"trainguard: {printable(message.splitlines()[0] if message else '')[:500]}{why}\n"
        if self._stderr_lines == STDERR_LINES:
            line += "trainguard: the guard's later errors are not shown (guard.log cannot be written)\n"
        try:
            sys.stderr.write(line)
            sys.stderr.flush()
        except Exception:
            pass  # no stderr either: the guard still must not raise

    def once(self, kind: str, message: str) -> bool:
        """Writes `message` the first time `kind` is seen, then only counts; True when it was written."""
        count = self._seen.get(kind, 0) + 1
        self._seen[kind] = count
        if count == 1:
            self.write(message)
            return True
        if count in REPEAT_MARKS:
            self.write(f"{kind}: seen {count} times (last: {message.splitlines()[0][:300]})")
        return False

    def error(self, where: str, exc: BaseException) -> None:
        kind = f"error in {where}: {type(exc).__name__}"
        if self._seen.get(kind):
            self.once(kind, f"{type(exc).__name__}: {exc}")
            return
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip()
        self.once(kind, f"{kind}: {exc}\n{tb}")


def _size(path: Path) -> int:
    try:
        return path.lstat().st_size
    except OSError:
        return 0
