"""The guard's own log, `guard.log` in the run folder.

The guard's errors go here, never into the training loop. Each distinct error is written once with
its traceback and then only counted, so a failure on every step cannot flood the disk.
"""

from __future__ import annotations

import os
import threading
import time
import traceback
from pathlib import Path

LOG_NAME = "guard.log"


class GuardLog:
    def __init__(self, run_dir: str | Path, rank: int = 0) -> None:
        self.path = Path(run_dir) / LOG_NAME
        self.rank = rank
        self._seen: dict[str, int] = {}
        self._lock = threading.Lock()

    def write(self, message: str) -> None:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        try:
            with self._lock, open(self.path, "a") as fh:
                fh.write(f"{stamp} pid={os.getpid()} rank={self.rank} {message}\n")
        except OSError:
            pass  # nowhere left to report to; the guard still must not raise

    def error(self, where: str, exc: BaseException) -> None:
        key = f"{where}:{type(exc).__name__}:{exc}"
        count = self._seen.get(key, 0) + 1
        self._seen[key] = count
        if count == 1:
            tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip()
            self.write(f"error in {where}: {type(exc).__name__}: {exc}\n{tb}")
        elif count in (10, 100, 1000):
            self.write(f"error in {where} repeated {count} times: {type(exc).__name__}: {exc}")
