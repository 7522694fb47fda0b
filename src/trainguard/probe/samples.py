"""Memory samples for the rules (memory-creep, device-memory-near-full).

Taken on the training thread as steps complete (every few steps, at most MIN_STEP_SAMPLE_GAP apart), and
by the probe's background thread when no step brought one for SAMPLE_INTERVAL (a long evaluation).

Host RSS comes from psutil. Device numbers come from `torch.cuda.memory_allocated`,
`max_memory_allocated`, `memory_reserved` (the caching allocator's own counters, read on the host) and
`mem_get_info` (the driver's free/total); none of them waits for the device. CUDA is only asked when the
training process has already initialised it: sampling must never be what creates a CUDA context.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from trainguard.contract import EVENT_SAMPLE
from trainguard.probe.capturegate import GATE

SAMPLE_INTERVAL = 1.0  # seconds: the background thread samples when no step did for this long
MIN_STEP_SAMPLE_GAP = 0.05  # seconds: at most 20 samples a second from the training thread (~10 us each)
# Memory is also sampled on the training thread as steps complete, so the memory rules see a leak within
# a share of the run however fast the steps are: at most this many samples over the planned run (and no
# closer than MIN_STEP_SAMPLE_GAP seconds apart, which bounds the cost on a fast loop).
SAMPLES_PER_RUN = 1000
MAX_SAMPLE_EVERY = 20  # ...but at least one every 20 steps, so a long run's leak is seen within 200 steps


class MemorySampler:
    """The probe's memory samples: on completed steps (training thread) and from the background thread.

    `writer` queues the background samples; `log` takes its own failure (sampling switches off, the guard
    does not); `phases` names the phase each sample was taken in."""

    def __init__(self, writer: Any, log: Any, phases: Any, total_steps: int | None) -> None:
        self._writer = writer
        self._log = log
        self._phases = phases
        self._total_steps = total_steps
        self._process = own_process()
        self.cuda_index: int | None = None  # the device this process trains on, once a step showed it
        self._last = 0.0
        self._last_step = 0
        self.next_step = 0  # the first step a sample on the training thread may come at (asked before the call)
        self._on = True  # off after the first failure to read memory (logged once)

    def on_step(self, rec: dict[str, Any]) -> None:
        """Memory at a completed step (training thread): every few steps, rate-limited in time.

        The sample rides with the step's record and is stored after its row, with its step; reading the
        counters costs microseconds and never waits for the device."""
        step = rec.get("step") or 0
        # The gap is a share of the planned length; without one it grows with the run (step/1000), so an
        # open-ended run stores samples in proportion to the logarithm of its steps (~2,300 per tenfold).
        every = min(MAX_SAMPLE_EVERY, max(1, (self._total_steps or step) // SAMPLES_PER_RUN))
        if not self._on or step - self._last_step < every:
            self.next_step = self._last_step + every
            return
        now = time.time()
        if now - self._last < MIN_STEP_SAMPLE_GAP or GATE.capturing:
            return  # (cudaMemGetInfo during a CUDA graph capture would invalidate it: probe/capturegate.py)
        self._last_step, self._last = step, now
        self.next_step = step + every
        rec["memory"] = self._sample()

    def background(self, step: int) -> None:
        """Host and device memory from the background thread when no step brought a sample for a second
        (a long evaluation, a slow step); no device sync."""
        now = time.time()
        if not self._on or now - self._last < SAMPLE_INTERVAL:
            return
        with GATE.device_work() as free:
            if not free:
                return  # a CUDA graph capture is open: the next flush samples
            self._last = now
            sample = self._sample()
        if sample:
            self._writer.add_event(EVENT_SAMPLE, "memory", sample, step=step)

    def _sample(self) -> dict[str, Any] | None:
        """A memory sample with the phase it was taken in, or None; a failure turns sampling off (once
        logged), never the guard: losing memory samples must not cost the run its step rows."""
        try:
            sample = memory_sample(self._process, self.cuda_index)
        except Exception as exc:
            self._on = False
            self._log.error("memory samples (switched off)", exc)
            return None
        if sample:
            sample["phase"] = self._phases.current
        return sample


def memory_sample(process: Any, device_index: int | None = None) -> dict[str, Any]:
    """Host RSS, and the numbers of CUDA device `device_index` (the one the loop's tensors live on).

    The device comes from the training thread: this runs on the background thread, whose current
    device is always 0, so asking it would read (and wake a context on) the wrong GPU.
    """
    sample: dict[str, Any] = {}
    if process is not None:
        sample["rss"] = process.rss() if isinstance(process, StatmReader) else process.memory_info().rss
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
    """This process's RSS reader: /proc/self/statm read through a file kept open (~5 us, where psutil's
    `memory_info()` costs ~100 us in a training loop: a sample every few steps is on the training thread),
    else psutil's."""
    try:
        return StatmReader()
    except Exception:
        pass
    try:
        import psutil

        return psutil.Process()
    except Exception:
        return None


class StatmReader:
    """Resident set size from /proc/<pid>/statm, the same number psutil reads there (resident pages times
    the page size), through a descriptor opened once. Linux only; `own_process` falls back to psutil."""

    def __init__(self) -> None:
        self._pid = os.getpid()
        self._fd = os.open(f"/proc/{self._pid}/statm", os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        self._page = os.sysconf("SC_PAGE_SIZE")
        self.rss()  # (a statm it cannot read raises here, at start-up)

    def rss(self) -> int:
        return int(os.pread(self._fd, 256, 0).split()[1]) * self._page

    def __del__(self) -> None:
        try:
            os.close(self._fd)
        except Exception:
            pass
