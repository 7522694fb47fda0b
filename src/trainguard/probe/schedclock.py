"""The training thread's own CPU time and its time waiting for a CPU, from Linux's schedstat.

    clock = SchedClock()
    clock.per_step(step)   # (CPU s, run-queue wait s) a step since the last call, or None

`/proc/thread-self/schedstat` holds three numbers for the calling thread: nanoseconds on a CPU,
nanoseconds runnable but waiting for one (other processes had it), and time slices. `throughput-drop`
compares them with the wall time of a step: a slowdown whose extra time is run-queue wait, with the
thread's own CPU time unchanged, is the machine's (other jobs on the same cores), not the run's.

One `pread` on a file kept open (a few microseconds), called every 8th step. Elsewhere than Linux, or
when the file cannot be read, `per_step` returns None and the rule says nothing about whose it is.
"""

from __future__ import annotations

import os


class SchedClock:
    """Deltas of the calling thread's schedstat between calls; opened lazily, by the thread that calls."""

    def __init__(self) -> None:
        self._fd: int | None = None
        self._broken = False
        self._last: tuple[int, int, int] | None = None  # step, CPU ns, wait ns

    def per_step(self, step: int) -> tuple[float, float] | None:
        if self._broken:
            return None
        try:
            if self._fd is None:
                self._fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
            cpu_ns, wait_ns = (int(v) for v in os.pread(self._fd, 128, 0).split()[:2])
        except (OSError, ValueError, AttributeError):  # not Linux, or a kernel without schedstats
            self._broken = True
            return None
        last, self._last = self._last, (step, cpu_ns, wait_ns)
        if last is None or step <= last[0]:
            return None
        n = step - last[0]
        return (cpu_ns - last[1]) / n / 1e9, (wait_ns - last[2]) / n / 1e9

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
