"""Keeping the last few batches, so the one that made a loss non-finite can be saved and replayed.

`guard.batches(loader)` hands each item to `BatchRing.keep` (a deque append and a size estimate, no
copy). When the background thread resolves a step whose loss is NaN or inf, it asks the ring for that
step's micro-batches and saves them with `torch.save` into the run folder. Only host (CPU) data is
kept, at most `MAX_ITEMS` items and `MAX_BYTES` bytes: holding device tensors would hold device memory,
and the ring must never be what makes a run run out of memory. A step resolved after its batches left
the ring is reported as such.
"""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

MAX_ITEMS = 256
MAX_BYTES = 256 * 2**20
MAX_SAVES = 3  # a run that is NaN at every step needs three examples, not thousands of files


def host_bytes(item: Any, depth: int = 0) -> int | None:
    """Bytes of the tensors/arrays in `item` (tuples, lists, dicts, two levels); None if any is on a device."""
    if depth > 2:
        return 0
    if type(item) is tuple and depth == 0:
        # the common batch, (x, y) of tensors: the loop below without its general checks (~1 us, not ~5)
        total = 0
        for part in item:
            cls = type(part)
            if cls not in _TENSOR_CLASSES:
                if cls.__name__ not in _TENSOR_TYPES or not cls.__module__.startswith("torch"):
                    break
                _TENSOR_CLASSES.add(cls)  # (asked once per class, not per batch)
            if not part.is_cpu:
                return None
            total += part.nbytes
        else:
            return total
    device = getattr(item, "device", None)
    if device is not None and hasattr(item, "element_size"):
        if getattr(device, "type", "cpu") != "cpu":
            return None
        return item.numel() * item.element_size()
    if hasattr(item, "nbytes") and not isinstance(item, (bytes, bytearray)):
        return int(item.nbytes)
    parts = item.values() if isinstance(item, dict) else item if isinstance(item, (tuple, list)) else ()
    total = 0
    for part in parts:
        size = host_bytes(part, depth + 1)
        if size is None:
            return None
        total += size
    return total


_TENSOR_TYPES = ("Tensor", "Parameter")
_TENSOR_CLASSES: set[type] = set()  # classes seen to be torch's tensors


class BatchRing:
    def __init__(self) -> None:
        self.items: collections.deque[tuple[int, Any, int]] = collections.deque()
        self.bytes = 0
        self.saved = 0

    def keep(self, micro: int, item: Any) -> bool:
        """Called on the training thread with the micro-batch index that will consume `item`; False when it
        is not kept (on a device, or larger than the ring)."""
        size = host_bytes(item)
        if size is None or size > MAX_BYTES:
            return False
        items = self.items
        if len(items) >= MAX_ITEMS:  # the ring is full (the usual case): the oldest goes
            self.bytes -= items.popleft()[2]
        items.append((micro, item, size))
        self.bytes += size
        while self.bytes > MAX_BYTES and items:
            self.bytes -= items.popleft()[2]
        return True

    def save(self, run_dir: Path, step: int, first_micro: int, last_micro: int) -> str:
        """Saves the step's micro-batches; returns the path, or why they could not be saved."""
        if self.saved >= MAX_SAVES:
            return f"not saved: {MAX_SAVES} batches already saved in this run"
        held = [(m, item) for m, item, _ in list(self.items) if first_micro <= m <= last_micro]
        if not held:
            return "not saved: the batch had left the guard's ring of recent batches (or was on a device)"
        import torch

        path = Path(run_dir) / f"nonfinite-step{step}.pt"
        torch.save({"step": step, "micro": [m for m, _ in held], "batches": [item for _, item in held]}, path)
        self.saved += 1
        return str(path)
