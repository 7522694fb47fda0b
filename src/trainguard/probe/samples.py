"""Memory samples for the rules (memory-creep, device-memory-near-full), taken by the probe's background thread.

Host RSS comes from psutil. Device numbers come from `torch.cuda.memory_allocated`,
`max_memory_allocated`, `memory_reserved` (the caching allocator's own counters, read on the host) and
`mem_get_info` (the driver's free/total); none of them waits for the device. CUDA is only asked when the
training process has already initialised it: sampling must never be what creates a CUDA context.
"""

from __future__ import annotations

import sys
from typing import Any

SAMPLE_INTERVAL = 1.0  # seconds between samples: at most one a second, off the training thread


def memory_sample(process: Any) -> dict[str, Any]:
    sample: dict[str, Any] = {}
    if process is not None:
        sample["rss"] = process.memory_info().rss
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is not None and cuda.is_available() and cuda.is_initialized():
        dev = cuda.current_device()
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
