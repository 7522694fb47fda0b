"""The hand-off between the training thread and the background thread: finished records with their
device values, in the order they were made.

The step assembler (probe/steps.py) only appends to the tails; the drain (probe/drain.py) only removes
from the heads. Lists, not queues: an append and a slice deletion are each atomic under the interpreter
lock, and the drain must see the whole backlog to copy several steps' values to the host at once.
"""

from __future__ import annotations

from typing import Any

from trainguard.probe.state import ProbeState


class Handoff:
    """Steps and expert loads on their way from the training thread to the store."""

    def __init__(self) -> None:
        # completed steps: (record, DEFERRED) while a GPU step's values wait to be stacked by the drain,
        # else (record, [DevicePack or Staged, ...]); see `StepRecorder._emit` and `Drain._prepare`
        self.steps: list[tuple[dict[str, Any], Any]] = []
        self.experts: list[tuple[int, Any, Any, Any]] = []  # (step, layer, host copy, event) from guard.experts
        # the optimizer hooks' parameter sample before an update (a device tensor): held here so that a
        # sticky device error abandons it with the rest, never freed
        self.update_snapshot: Any = None
        # set by the drain once a value was seen changed in place after it was given: from then on the
        # assembler stacks a GPU step's values as the step closes, not the drain
        self.stage_here = False

    def abandon(self, state: ProbeState, exc: BaseException) -> None:
        """The device is in a sticky error state (a device-side assert, an illegal access): every copy still
        in flight is unreadable. Drop them without waiting, and never free them: freeing pinned blocks and
        events after such an error can throw inside a C++ destructor and abort the process, which would
        turn the user's clean crash (exit 1, a traceback) into a SIGABRT."""
        state.device_broken = True
        state.fail("device copies abandoned", exc)
        abandoned = [self.steps[:], self.experts[:], self.update_snapshot]
        self.steps.clear()
        self.experts.clear()
        self.update_snapshot = None
        _keep_forever(abandoned)


def _keep_forever(obj: Any) -> None:
    """Make `obj` never be freed, not even at interpreter shutdown (see `Handoff.abandon`)."""
    import ctypes

    try:
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))
    except Exception:
        _FOREVER.append(obj)


_FOREVER: list[Any] = []
