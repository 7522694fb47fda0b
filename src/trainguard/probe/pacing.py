"""Work of the probe's background thread, cut into short stretches with a pause between them.

The background thread and the training thread share the interpreter lock. The training thread gives
the lock up at every torch call and takes it back when the call returns; while the background thread
runs Python (turning a second's worth of device copies into rows, a pass of the health rules), each
of those returns waits until the background thread lets go, which it is only forced to do every
`sys.getswitchinterval()` (5 ms). A 15 ms rules pass then held a step of a small loop back by about
as long (guarded steps 20-38 ms slower than their unguarded twins, once in a few thousand steps).
Paced, the background thread works at most `CHUNK_S` at a time and then sleeps `PAUSE_S`, during which
the training thread runs freely: a step loses at most about one stretch, and the work is the same,
only spread over a little more wall time.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

CHUNK_S = 0.0005  # the longest stretch of background work between two pauses
PAUSE_S = 0.001  # the pause: the training thread has the interpreter to itself meanwhile

T = TypeVar("T")


def paced(items: Iterable[T], enabled: bool = True, stop: Any = None) -> Iterator[T]:
    """Yields `items`, sleeping `PAUSE_S` whenever `CHUNK_S` of work has passed since the last pause.

    `enabled=False` (the last drain, at the end of the run, when nothing trains any more) never sleeps,
    nor does it once `stop` (a threading.Event) is set: the run is ending and waits for this pass."""
    if not enabled:
        yield from items
        return
    clock = time.perf_counter
    t0 = clock()
    for item in items:
        yield item
        if clock() - t0 > CHUNK_S and not (stop is not None and stop.is_set()):
            time.sleep(PAUSE_S)
            t0 = clock()
