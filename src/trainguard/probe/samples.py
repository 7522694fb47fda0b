"""Memory samples for the rules (memory-creep, device-memory-near-full).

Taken on the training thread as steps complete (every few steps, at most MIN_STEP_SAMPLE_GAP apart), and
by the probe's background thread when no step brought one for SAMPLE_INTERVAL (a long evaluation).

Host RSS comes from psutil. Device numbers come from `torch.cuda.memory_allocated`,
`max_memory_allocated`, `memory_reserved` (the caching allocator's own counters, read on the host) and
`mem_get_info` (the driver's free/total); none of them waits for the device. CUDA is only asked when the
training process has already initialised it: sampling must never be what creates a CUDA context.
"""

from __future__ import annotations

import sys
from typing import Any

SAMPLE_INTERVAL = 1.0  # seconds: the background thread samples when no step did for this long
MIN_STEP_SAMPLE_GAP = 0.05  # seconds: at most 20 samples a second from the training thread (~10 us each)


def memory_sample(process: Any, device_index: int | None = None) -> dict[str, Any]:
    """Host RSS, and the numbers of CUDA device `device_index` (the one the loop's tensors live on).

    The device comes from the training thread: this runs on the background thread, whose current
    device is always 0, so asking it would read (and wake a context on) the wrong GPU.
    """
    sample: dict[str, Any] = {}
    if process is not None:
        sample["rss"] = process.memory_info().rss
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if device_index is not None and cuda is not None and cuda.is_initialized():
        dev = device_index
        free, total = cuda.mem_get_info(dev)
        allocated, peak, reserved = _allocator_counters(torch, dev)
        sample.update({
            "device": dev, "dev_allocated": allocated, "dev_max_allocated": peak,
            "dev_reserved": reserved, "dev_free": free, "dev_total": total,
        })
    return sample


def _allocator_counters(torch: Any, dev: int) -> tuple[int, int, int]:
    """Allocated (now and peak) and reserved bytes of the caching allocator, from one stats call.

    `torch.cuda.memory_allocated()` and its siblings each flatten the allocator's whole nested stats
    dict in Python: ~60 us apiece on an H200. The nested dict itself costs ~10 us, so it is read once;
    the public functions stay as the fallback should the private call change."""
    try:
        stats = torch._C._cuda_memoryStats(dev)
        return (stats["allocated_bytes"]["all"]["current"], stats["allocated_bytes"]["all"]["peak"],
                stats["reserved_bytes"]["all"]["current"])
    except Exception:
        cuda = torch.cuda
        return cuda.memory_allocated(dev), cuda.max_memory_allocated(dev), cuda.memory_reserved(dev)


def own_process() -> Any:
    try:
        import psutil

        return psutil.Process()
    except Exception:
        return None
