"""Work of the probe's background thread, cut into short stretches with a pause between them.

The background thread and the training thread share the interpreter lock. The training thread gives
the lock up at every torch call and takes it back when the call returns; while the background thread
runs Python (turning a second's worth of device copies into rows, a commit, a pass of the health rules),
each of those returns waits until the background thread lets go, which it is only forced to do every
`sys.getswitchinterval()` (5 ms). Its own brief releases (a sqlite step, a file write) do not hand the
lock over: it takes it back before the waiting thread wakes. A 15 ms rules pass then held a step of a
small loop back by about as long (guarded steps 20-38 ms slower than their unguarded twins, once in a
few thousand steps).

Paced, the background thread works at most `CHUNK_S` at a time and then sleeps `PAUSE_S`, during which
the training thread runs freely: a step loses at most about one stretch, and the work is the same,
only spread over a little more wall time. The budget is the thread's, not one loop's: a pass is several
parts in a row (drain the rows, commit them, the rules, status.json), and a stretch that ends one part
goes on into the next unless a pause (`breathe`) comes between them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

CHUNK_S = 0.0005  # the longest stretch of background work between two pauses
PAUSE_S = 0.001  # the pause: the training thread has the interpreter to itself meanwhile

T = TypeVar("T")

_stretch = threading.local()  # .t0, .cpu0: when this thread's current stretch of work began (wall, CPU)


class Stretches:
    """The paced threads' stretches of work between two pauses, in CPU seconds: how long the background
    thread may have kept the interpreter lock from the training thread in one go (an upper bound: CPU in
    calls that let go of the lock counts too). Read at pauses only (two clock reads each), for
    benchmarks/fair_overhead.py."""

    def __init__(self) -> None:
        self.count = 0
        self.longest = 0.0
        self.over_1ms = 0

    def add(self, cpu_s: float) -> None:
        self.count += 1
        if cpu_s > self.longest:
            self.longest = cpu_s
        if cpu_s > 0.001:
            self.over_1ms += 1


STRETCHES = Stretches()


def rested() -> None:
    """This thread just waited (between two passes): its stretch of work begins now."""
    _stretch.t0 = time.perf_counter()
    _stretch.cpu0 = time.thread_time()


def resting() -> None:
    """This thread's pass is over and it waits now: its stretch of work ends (counted in STRETCHES)."""
    cpu0 = getattr(_stretch, "cpu0", None)
    if cpu0 is not None:
        STRETCHES.add(time.thread_time() - cpu0)
        _stretch.cpu0 = None


def breathe(stop: Any = None) -> None:
    """A point where a pass may pause: sleeps `PAUSE_S` when `CHUNK_S` of work has passed since this
    thread's last pause. Never once `stop` (a threading.Event) is set: the run is ending and waits."""
    t0 = getattr(_stretch, "t0", None)
    if t0 is None:
        rested()
    elif time.perf_counter() - t0 > CHUNK_S and not (stop is not None and stop.is_set()):
        resting()
        time.sleep(PAUSE_S)
        rested()


def paced(items: Iterable[T], enabled: bool = True, stop: Any = None) -> Iterator[T]:
    """Yields `items`, with a `breathe` after each.

    `enabled=False` (the last drain, at the end of the run, when nothing trains any more) never sleeps,
    nor does it once `stop` is set."""
    if not enabled:
        yield from items
        return
    if getattr(_stretch, "t0", None) is None:
        rested()
    for item in items:
        yield item
        breathe(stop)
