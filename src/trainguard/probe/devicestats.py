"""Getting numbers off the device without making the training thread wait for them.

The training thread only *launches* work: it stacks the step's scalars into one small tensor and, on a
GPU, starts a non-blocking copy into pinned host memory and records an event. The background thread
later asks the event whether the copy is done (`query()` never blocks) and only then reads the values.
So the hot path never synchronises host and device; this is the whole trick, and why a per-step
`loss.item()` (7.7% on an H200 GPT-2-sized step) is never called here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class DevicePack:
    """Named scalars of one step, on their way from the device to the host."""

    names: list[str]
    host: Any  # torch.Tensor: pinned host memory on CUDA, the tensor itself elsewhere
    event: Any  # torch.cuda.Event or None

    def ready(self) -> bool:
        return self.event is None or self.event.query()

    def wait(self) -> bool:
        """Blocks until the copy is done: only for the last drain, when the run is ending anyway.

        False when it cannot be waited for (a sticky CUDA error after a device-side assert): the values
        are then unreadable and must be dropped, not read.
        """
        if self.event is not None:
            try:
                self.event.synchronize()
            except Exception:
                return False
        return True

    def pairs(self) -> list[tuple[str, float]]:
        """(name, value) in packing order; a name repeats when several micro-batches reported it."""
        # Off the training thread. On CUDA the event has completed, so this reads finished host memory;
        # on other devices it may wait for the device, but only this background thread waits.
        if isinstance(self.host, list):  # CPU tensors, unstacked: each is read where it is
            return [(n, float(t)) for n, t in zip(self.names, self.host)]
        return list(zip(self.names, self.host.tolist()))


def as_scalar(tensor: Any) -> Any:
    """A 0-d float32 view or reduction of `tensor`, detached; launches at most a kernel or two."""
    t = tensor.detach()
    if t.dim() == 0 and t.dtype == _float32():
        return t  # the common case, a float32 scalar loss: nothing to launch
    if t.numel() != 1:
        t = t.float().mean()
    else:
        t = t.reshape(())
    if t.dtype != _float32():
        t = t.float()
    return t


_F32 = None


def _float32() -> Any:
    global _F32
    if _F32 is None:
        import torch

        _F32 = torch.float32
    return _F32


def pack(named: list[tuple[str, Any]]) -> list[DevicePack]:
    """Stack named 0-d tensors (grouped by device) and start moving them to the host."""
    import torch

    groups: dict[Any, list[tuple[str, Any]]] = {}
    for name, tensor in named:
        groups.setdefault(tensor.device, []).append((name, tensor))
    packs = []
    for device, items in groups.items():
        if device.type == "cpu":
            # On the CPU there is no copy to make and nothing to wait for: keep the scalars as they are
            # (the background thread reads them), which saves the stack's allocation and kernel.
            packs.append(DevicePack([n for n, _ in items], [t for _, t in items], None))
            continue
        vec = torch.stack([t for _, t in items])
        if device.type == "cuda":
            host, event = copy_to_host(vec)
            packs.append(DevicePack([n for n, _ in items], host, event))
        else:
            packs.append(DevicePack([n for n, _ in items], vec, None))
    return packs


def copy_to_host(tensor: Any) -> tuple[Any, Any]:
    """Start a non-blocking copy of a CUDA tensor into pinned host memory; returns (host, event).

    The copy and the event go on the stream of the tensor's own device, not the thread's current device:
    a model on cuda:1 without `set_device(1)` would otherwise get an event that completes before its copy.
    """
    import torch

    with torch.cuda.device(tensor.device):
        host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
        host.copy_(tensor, non_blocking=True)
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(tensor.device))
    return host, event
