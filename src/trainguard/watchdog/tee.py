"""Tee a child's stdout and stderr to the terminal and to output.log, counting lines as they pass.

Bytes are passed through unchanged (progress bars keep their carriage returns); lines are split on
\\n and \\r for counting and for the stderr tail that crash parsing reads. One thread per stream.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from typing import IO, Any


class OutputCapture:
    def __init__(self, log_path: str | os.PathLike, echo: bool = True, tail_lines: int = 400) -> None:
        self._log = open(log_path, "ab")
        self._lock = threading.Lock()
        self.echo = echo
        self.stderr_tail: collections.deque[str] = collections.deque(maxlen=tail_lines)
        self.stdout_tail: collections.deque[str] = collections.deque(maxlen=tail_lines)
        self.lines = 0
        self.last_output: float | None = None
        self._threads: list[threading.Thread] = []
        self.before_write: Any = None  # called under the lock before echoing (clears the status line)

    def start(self, stream: IO[bytes], name: str, sink: IO[bytes] | None) -> None:
        t = threading.Thread(target=self._pump, args=(stream, name, sink), name=f"tee-{name}", daemon=True)
        t.start()
        self._threads.append(t)

    def _pump(self, stream: IO[bytes], name: str, sink: IO[bytes] | None) -> None:
        tail = self.stderr_tail if name == "stderr" else self.stdout_tail
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
                self._log.write(chunk)
                self._log.flush()
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
            for piece in pieces:
                tail.append(piece.decode("utf-8", "replace"))
            self.lines += len(pieces)
            self.last_output = now
        if partial:
            tail.append(partial.decode("utf-8", "replace"))
            self.lines += 1

    def drain(self, timeout: float = 5.0) -> None:
        """Waits for the streams of a process that ended; the log stays open for a restarted one."""
        for t in self._threads:
            t.join(timeout)

    def join(self, timeout: float = 5.0) -> None:
        self.drain(timeout)
        with self._lock:
            self._log.close()

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
