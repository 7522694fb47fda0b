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
        sample.update({
            "device": dev, "dev_allocated": cuda.memory_allocated(dev), "dev_max_allocated": cuda.max_memory_allocated(dev),
            "dev_reserved": cuda.memory_reserved(dev), "dev_free": free, "dev_total": total,
        })
    return sample


def own_process() -> Any:
    try:
        import psutil

        return psutil.Process()
    except Exception:
        return None
