"""CUDA graph captures in the process: while one is under way, the probe stays off the CUDA runtime.

Why: `torch.cuda.graph(g)` captures in its default `capture_error_mode="global"`, where a CUDA runtime
call that is unsafe during a capture (`cudaEventQuery`, `cudaMemGetInfo`, a pinned allocation, an
event synchronisation) made by ANY thread of the process invalidates the capture
(`cudaErrorStreamCaptureInvalidated`). The probe's background thread makes such calls a few times a
second (reading its device copies, memory samples), so a user's own capture under the guard could fail
because of the guard. And the probe's hooks on the capturing thread (the optimizer's, the contract
checks') would launch their kernels into the user's graph, or query the device mid-capture.

How: `torch.cuda.CUDAGraph.capture_begin` and `capture_end` (the Python class's methods, which
`torch.cuda.graph` and `make_graphed_callables` go through) are wrapped once, when a probe starts in a
process that has imported torch (a process that never uses CUDA only pays the wrapping). capture_begin
first counts its capture in (`GATE.capturing`), then takes `GATE.lock`, which the background thread
holds around its device work: so it waits for the pass under way, which stops early once it sees the
count, and no device call of the probe can start after it. capture_end counts the capture out whatever
it raised, and so does a capture_begin that raised. While a capture is counted in, the background
thread defers its device reads (they wait on the device until the next flush: nothing is lost) and the
probe's hooks do nothing device-side (a plain attribute read: no CUDA call, ~30 ns).

Fail-open: an error of the gate itself never reaches the user's capture (it is noted in `GATE.errors`
and the probe logs it once). `TRAINGUARD_CAPTURE_GATE=0` leaves torch's class alone.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator
from typing import Any

from trainguard.contract import ENV_CAPTURE_GATE

LOCK_WAIT_S = 10.0  # capture_begin waits at most this long for the background thread's pass (it is ms)


class CaptureGate:
    """The captures open in this process and the lock the background thread's device work runs under."""

    def __init__(self) -> None:
        self.capturing = 0  # captures open now (read without a lock on the hot path)
        # a capture was ever begun in this process: a graph's replays rewrite its outputs without moving their
        # version counters, so the probe reads a step's values as the step closes (probe/steps.py `_emit`)
        self.captured = False
        self.lock = threading.Lock()  # held by the background thread around its device work
        self.errors: list[str] = []  # the gate's own troubles, for the probe's log
        self._open: dict[int, int] = {}  # id(graph) -> the thread capturing it

    def begin(self, graph: Any) -> None:
        """A capture starts: counted in first, then wait for the background thread's device work to end."""
        try:
            self.captured = True
            self._open[id(graph)] = threading.get_ident()
            self.capturing = len(self._open)
            if self.lock.acquire(timeout=LOCK_WAIT_S):
                self.lock.release()  # a barrier: the background thread checks the count under the lock
            else:
                self.note(f"a CUDA graph capture began while the probe's device work ran past {LOCK_WAIT_S:g} s")
        except Exception as exc:
            self.note(f"capture gate: {type(exc).__name__}: {exc}")

    def end(self, graph: Any) -> None:
        """A capture ended (or failed to begin): counted out."""
        try:
            self._open.pop(id(graph), None)
            self.capturing = len(self._open)
        except Exception as exc:
            self.note(f"capture gate: {type(exc).__name__}: {exc}")

    def here(self) -> bool:
        """Whether the calling thread is the one capturing (only asked while `capturing`)."""
        return threading.get_ident() in self._open.values()

    @contextlib.contextmanager
    def device_work(self) -> Iterator[bool]:
        """The background thread's device work: yields True when it may touch CUDA (no capture open),
        holding the lock so that no capture can begin until it is done."""
        with self.lock:
            yield not self.capturing

    def note(self, line: str) -> None:
        if len(self.errors) < 20:
            self.errors.append(line)


GATE = CaptureGate()
_installed: list[Any] = []  # the class wrapped, once per process


def install() -> bool:
    """Wraps `torch.cuda.CUDAGraph`'s capture_begin/capture_end once (idempotent, fail-open). False when
    torch is not imported, has no CUDA graphs, or `TRAINGUARD_CAPTURE_GATE=0`."""
    if _installed:
        return True
    if os.environ.get(ENV_CAPTURE_GATE, "1") == "0":
        return False
    torch = sys.modules.get("torch")
    graph_class = getattr(getattr(torch, "cuda", None), "CUDAGraph", None)
    if graph_class is None:
        return False
    try:
        wrap(graph_class)
        _installed.append(graph_class)
    except Exception as exc:
        GATE.note(f"capture gate not installed: {type(exc).__name__}: {exc}")
        return False
    return True


def wrap(graph_class: Any, gate: CaptureGate = GATE) -> None:
    """Replaces `graph_class`'s capture_begin and capture_end by versions that tell `gate`."""
    begin, end = graph_class.capture_begin, graph_class.capture_end

    def capture_begin(self: Any, *args: Any, **kwargs: Any) -> Any:
        gate.begin(self)
        try:
            return begin(self, *args, **kwargs)
        except BaseException:
            gate.end(self)  # no capture began
            raise

    def capture_end(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return end(self, *args, **kwargs)
        finally:
            gate.end(self)  # also when the capture failed (invalidated, an error inside it)

    for new, old in ((capture_begin, begin), (capture_end, end)):
        new.__name__, new.__qualname__, new.__doc__ = old.__name__, old.__qualname__, old.__doc__
        new.__wrapped__ = old  # type: ignore[attr-defined]
    graph_class.capture_begin = capture_begin
    graph_class.capture_end = capture_end
