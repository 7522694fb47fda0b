"""Whose time a step took: the training thread's CPU and run-queue wait, the process's CPU, the machine's.

    clock = SchedClock()
    clock.per_step(step)   # {"cpu_s", "run_wait_s", "proc_cpu_s", "others_cores"} since the last call, or None

- `/proc/thread-self/schedstat` holds three numbers for the calling thread: nanoseconds on a CPU,
  nanoseconds runnable but waiting for one (other processes had it), and time slices;
- the process's CPU time (every thread: torch's intra-op threads do most of a CPU step's work, and the
  training thread waits for them in a futex, which is neither CPU nor run-queue wait of its own);
- the machine's busy time from the first line of `/proc/stat` (every core, steal included), less the
  process's own: `others_cores`, how many cores other processes kept busy over the interval.
- the tasks runnable now over the cores (`/proc/loadavg`'s fourth field): `runnable_per_core`. Busy
  cores saturate: on a machine already full before the run's baseline, other processes cannot keep more
  cores busy, but more of them still queue for the same cores.

`throughput-drop` compares them with the wall time of a step: a slowdown that the process's CPU time does
not share is not the run's work; when other processes' load rose with it, it is the machine's.

A few small reads, called every 8th step. Elsewhere than Linux, or when schedstat cannot be read,
`per_step` returns None and the rule says nothing about whose the time is; `/proc/stat` alone missing
leaves `others_cores` out.
"""

from __future__ import annotations

import os
import time

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class SchedClock:
    """Deltas between calls; opened lazily, by the thread that calls (the training thread)."""

    def __init__(self) -> None:
        self._fd: int | None = None
        self._stat: int | None = None
        self._loadavg: int | None = None
        self._cores = os.cpu_count() or 1
        self._broken = False
        self._last: tuple[int, int, int, float, float, float | None] | None = None  # step, ns, ns, proc, wall, busy

    def per_step(self, step: int) -> dict[str, float] | None:
        if self._broken:
            return None
        try:
            if self._fd is None:
                self._fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
            cpu_ns, wait_ns = (int(v) for v in os.pread(self._fd, 128, 0).split()[:2])
        except (OSError, ValueError, AttributeError):  # not Linux, or a kernel without schedstats
            self._broken = True
            return None
        now = (step, cpu_ns, wait_ns, time.process_time(), time.monotonic(), self._busy())
        last, self._last = self._last, now
        if last is None or step <= last[0]:
            return None
        n = step - last[0]
        out = {"cpu_s": (cpu_ns - last[1]) / n / 1e9, "run_wait_s": (wait_ns - last[2]) / n / 1e9,
               "proc_cpu_s": (now[3] - last[3]) / n}
        wall = now[4] - last[4]
        if now[5] is not None and last[5] is not None and wall > 0:
            out["others_cores"] = max(0.0, (now[5] - last[5]) - (now[3] - last[3])) / wall
        runnable = self._runnable()
        if runnable is not None:
            out["runnable_per_core"] = runnable / self._cores
        return out

    def _runnable(self) -> int | None:
        """Tasks runnable at this moment, machine-wide (this thread included)."""
        try:
            if self._loadavg is None:
                self._loadavg = os.open("/proc/loadavg", os.O_RDONLY)
            return int(os.pread(self._loadavg, 128, 0).split()[3].split(b"/")[0])
        except (OSError, ValueError, IndexError):
            return None

    def _busy(self) -> float | None:
        """Seconds every core of the machine was busy (user, nice, system, irq, softirq, steal) since boot."""
        try:
            if self._stat is None:
                self._stat = os.open("/proc/stat", os.O_RDONLY)
            head = os.pread(self._stat, 256, 0).split(b"\n", 1)[0].split()
            user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in head[1:9])
        except (OSError, ValueError):
            return None
        return (user + nice + system + irq + softirq + steal) / _TICK

    def close(self) -> None:
        for fd in (self._fd, self._stat, self._loadavg):
            if fd is not None:
                os.close(fd)
        self._fd = self._stat = self._loadavg = None
