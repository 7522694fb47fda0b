"""Tee a child's stdout and stderr to the terminal and to output.log, counting lines as they pass.

Bytes are passed through unchanged (progress bars keep their carriage returns); lines are split on
\\n and \\r for counting and for the stderr tail that crash parsing reads. One thread per stream.
"""

from __future__ import annotations

import collections
import errno
import os
import threading
import time
from typing import IO, Any

from trainguard.folderio import open_append
from trainguard.watchdog.dying import ProgressLines

RETRY_LOG = 5.0  # seconds between tries to write output.log again after it failed

class OutputCapture:
    def __init__(self, log_path: str | os.PathLike, echo: bool = True, tail_lines: int = 400) -> None:
        self.log_path = str(log_path)
        # never through a link planted in its place, never into a FIFO or a file of another name (folderio.py)
        self._log_fd: int | None = open_append(self.log_path)
        self._lock = threading.Lock()
        self.dropped_bytes = 0  # output that could not go into output.log (the terminal got it)
        self.log_error: str | None = None  # why output.log stopped taking output, while it does
        self._log_retry = 0.0
        self.note_sink: IO[bytes] | None = None  # where the one line about a failing log goes (stderr)
        self.echo = echo
        self.stderr_tail: collections.deque[str] = collections.deque(maxlen=tail_lines)
        self.stdout_tail: collections.deque[str] = collections.deque(maxlen=tail_lines)
        self.lines = 0
        self.last_output: float | None = None
        self.last_progress: float | None = None
        self.deaf_from: float | None = None  # lines read from then on are never progress (a signal was sent)
        self._threads: list[threading.Thread] = []
        self.before_write: Any = None  # called under the lock before echoing (clears the status line)

    def start(self, stream: IO[bytes], name: str, sink: IO[bytes] | None) -> None:
        t = threading.Thread(target=self._pump, args=(stream, name, sink), name=f"tee-{name}", daemon=True)
        t.start()
        self._threads.append(t)

    def _pump(self, stream: IO[bytes], name: str, sink: IO[bytes] | None) -> None:
        tail = self.stderr_tail if name == "stderr" else self.stdout_tail
        progress = ProgressLines()
        partial = b""
        fd = stream.fileno()
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            now = time.time()
            with self._lock:
                self._to_log(chunk, now)
                if self.echo and sink is not None:
                    if self.before_write is not None:
                        self.before_write()
                    try:
                        sink.write(chunk)
                        sink.flush()
                    except (OSError, ValueError):
                        self.echo = False  # our terminal went away; keep logging to the file
            data = partial + chunk
            pieces = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
            partial = pieces.pop()
            if len(partial) > 1 << 20:  # an enormous line without a newline: count it and move on
                pieces.append(partial)
                partial = b""
            moving = False
            for piece in pieces:
                text = piece.decode("utf-8", "replace")
                tail.append(text)
                moving = progress.feed(text) or moving
            if not pieces and partial:  # a progress bar redrawn on one line
                moving = progress.peek(partial[-4096:].decode("utf-8", "replace"))
            self.lines += len(pieces)
            self.last_output = now
            if moving and (self.deaf_from is None or now < self.deaf_from):
                self.last_progress = now
        if partial:
            tail.append(partial.decode("utf-8", "replace"))
            self.lines += 1

    def _to_log(self, chunk: bytes, now: float) -> None:
        """Appends to output.log under the lock; never raises, never blocks on a failing disk for long."""
        if self._log_fd is None or (self.log_error is not None and now < self._log_retry):
            self.dropped_bytes += len(chunk)
            return
        try:
            if self.log_error is not None:
                _write_all(self._log_fd, f"\n[trainguard: {self.dropped_bytes} bytes of output were dropped "
                                         f"here: {self.log_error}]\n".encode())
                self.log_error = None
            _write_all(self._log_fd, chunk)
        except OSError as exc:
            first = self.log_error is None and self.dropped_bytes == 0
            self.log_error = os.strerror(exc.errno) if exc.errno else str(exc)
            self._log_retry = now + RETRY_LOG
            self.dropped_bytes += len(chunk)
            if first:
                self._say(f"trainguard: cannot write {self.log_path} ({self.log_error}): the command's output "
                          f"goes on to the terminal only, and is dropped from the file until it can be written")
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EFBIG):
                # not a disk that may free up (the file's folder is gone, read-only): stop trying
                self._log_retry = float("inf")

    def _say(self, text: str) -> None:
        sink = self.note_sink
        if sink is None:
            return
        try:
            if self.before_write is not None:
                self.before_write()
            sink.write(text.encode() + b"\n")
            sink.flush()
        except (OSError, ValueError):
            pass

    def drain(self, timeout: float = 5.0) -> None:
        """Waits for the streams of a process that ended; the log stays open for a restarted one."""
        for t in self._threads:
            t.join(timeout)

    def join(self, timeout: float = 5.0) -> None:
        self.drain(timeout)
        with self._lock:
            if self._log_fd is not None:
                try:
                    os.close(self._log_fd)
                except OSError:
                    pass
                self._log_fd = None

    def write_note(self, text: str, sink: IO[bytes] | None) -> None:
        """A line of trainguard's own on the terminal (not in output.log, which holds the command's output)."""
        with self._lock:
            if self.before_write is not None:
                self.before_write()
            if sink is not None:
                try:
                    sink.write(text.encode() + b"\n")
                    sink.flush()
                except (OSError, ValueError):
                    pass


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]
