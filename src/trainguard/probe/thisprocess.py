"""This process's id, kept current across forks without a system call on the hot path.

The probe's calls and hooks ask, every time, whether they run in the process that made the guard (a
forked DataLoader worker inherits the guard and must leave it alone). `os.getpid()` is a system call
(~0.1-0.3 us, several a micro-batch); the id is read once here and again in each forked child
(`os.register_at_fork`, which every `os.fork` runs, multiprocessing's included), so the question is an
attribute read: `thisprocess.pid != guard.pid`.
"""

from __future__ import annotations

import os

pid = os.getpid()


def _forked() -> None:
    global pid
    pid = os.getpid()


os.register_at_fork(after_in_child=_forked)
