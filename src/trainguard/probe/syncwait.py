"""How long each step a rank works alone before it synchronises with the others (for TG703 straggler-rank).

In data-parallel training every rank leaves the gradient all-reduce at the same moment, so step times
are equal on all ranks and say nothing about which rank the others wait for. What differs is the time a
rank spends *before* the synchronisation: from the end of the previous step's (the optimizer step,
after the all-reduce) to the start of this step's backward (where DDP's all-reduce begins). A straggler
takes longer there; the others spend the difference waiting inside the all-reduce.

Two host timestamps a step, no device work and no sync: the optimizer's step pre-hook marks the end of
the synchronised part, and a gradient hook on the model's output (registered by a forward hook) marks
the start of the backward. A DDP model that broadcasts its buffers at each forward (BatchNorm) syncs
there instead, so for it the forward's start is the mark. The value goes into the step's row as
`extra["presync_s"]` (the last micro-batch's, under gradient accumulation). Only in a distributed run.

On a GPU the host's times blur: a NCCL all-reduce returns at once, so a rank that waits for a slower one
waits wherever its host next needs the device (a `loss.item()` after the step counts as its own work
before the next synchronisation), or not at all while its host runs ahead. So the same two marks are
also CUDA events (timing on) recorded on the model's stream, and the device time between them goes into
`extra["presync_device_s"]`: the first completes when the gradient all-reduce has (the device runs in
order), the second when the device has run the optimizer step and the forward, so between them is the
device's own work plus the time it sat idle for its host (a straggler's slow data). Two event records
a step, read by the background thread once the step's row is made (probe/drain.py), never waited for.
"""

from __future__ import annotations

import os
import time
from typing import Any

from trainguard.probe.capturegate import GATE


def attach(guard: Any) -> SyncWait | None:
    """The measure for this guard's model and optimizer, when the run has more than one rank."""
    if guard.place["world_size"] < 2 or guard.model is None or guard.optimizer is None:
        return None
    try:
        import torch
    except ImportError:
        return None
    if not isinstance(guard.model, torch.nn.Module) or not hasattr(guard.optimizer, "register_step_pre_hook"):
        return None
    return SyncWait(guard)


class SyncWait:
    def __deepcopy__(self, memo: dict) -> SyncWait:
        return self  # as Guard: a deep-copied model shares the hooks' owner

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        from trainguard.probe.detached import Detached

        return (Detached, ())  # as Guard: a pickled model's hooks carry nothing

    def __init__(self, guard: Any) -> None:
        self.guard = guard
        self.synced_at: float | None = None  # when the last optimizer step began (after the all-reduce)
        self.failed = False
        model = guard.model
        self.device = _cuda_device(model)  # its device's events time the device's side (None: host only)
        self.synced_event: Any = None  # recorded when the last optimizer step began, on the model's stream
        forward_syncs = bool(getattr(model, "will_sync_module_buffers", lambda: False)())
        self.handles = [guard.optimizer.register_step_pre_hook(self._synced)]
        if forward_syncs:
            self.handles.append(model.register_forward_pre_hook(self._forward_starts))
        else:
            self.handles.append(model.register_forward_hook(self._forward_ends))

    def _synced(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.failed:
            return
        self.synced_at = time.perf_counter()
        if self.device is not None:
            try:
                self.synced_event = self._record()
            except Exception as exc:  # the guard never becomes the failure: not an error of optimizer.step()
                self.synced_event = None
                self._fail(exc)

    def _forward_starts(self, module: Any, args: Any) -> None:
        if module.training:
            self._mark()

    def _forward_ends(self, module: Any, args: Any, output: Any) -> None:
        if self.failed or self.synced_at is None or not module.training:
            return
        try:
            out = _first_grad_tensor(output)
            if out is not None:
                out.register_hook(self._backward_starts)  # host-side: no device work, no sync
        except Exception as exc:  # the guard never becomes the failure
            self._fail(exc)

    def _backward_starts(self, grad: Any) -> None:
        self._mark()

    def _mark(self) -> None:
        g = self.guard
        if self.failed or self.synced_at is None or g.state.disabled or os.getpid() != g.pid:
            return
        try:
            g.add_value("x:presync_s", time.perf_counter() - self.synced_at)
            start = self.synced_event
            if start is not None:  # (each micro-batch's mark adds one; the row keeps the last, as for the host's)
                end = self._record()
                if end is not None:
                    g.add_interval("x:presync_device_s", start, end)
        except Exception as exc:
            self._fail(exc)

    def _record(self) -> Any:
        """A timing event recorded now on the current stream of the model's device (no wait, no sync);
        None while a CUDA graph is captured (an event with timing cannot be recorded into one)."""
        import torch

        if GATE.capturing or torch.cuda.is_current_stream_capturing():  # (the second: the gate switched off)
            return None
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        return event

    def _fail(self, exc: Exception) -> None:
        self.failed = True
        for h in self.handles:
            h.remove()
        self.guard.fail("sync-wait measure", exc)


def _cuda_device(model: Any) -> Any:
    """The CUDA device of the model's first parameter, or None (CPU, meta, no parameters)."""
    try:
        param = next(model.parameters())
    except (StopIteration, AttributeError, TypeError):
        return None
    return param.device if getattr(param, "is_cuda", False) else None


def _first_grad_tensor(output: Any) -> Any:
    """The model's first output that gradients flow back through (a tensor, or one inside a tuple/dict/ModelOutput)."""
    import torch

    if isinstance(output, torch.Tensor):
        return output if output.requires_grad else None
    items = output.values() if isinstance(output, dict) else output if isinstance(output, (tuple, list)) else ()
    for item in items:
        if isinstance(item, torch.Tensor) and item.requires_grad:
            return item
    return None
