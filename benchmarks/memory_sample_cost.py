"""What one memory sample costs the training thread, and that it never waits for the device.

    python benchmarks/memory_sample_cost.py                 # host RSS only (CPU)
    python benchmarks/memory_sample_cost.py --device cuda   # plus the CUDA allocator's counters and
                                                            # the driver's free/total (mem_get_info)

The probe takes a sample on the training thread as steps complete (at most 20 a second), so its cost
bounds what memory sampling adds to a step. On CUDA the sample is also taken while a ~1 s kernel keeps
the device busy: if it waited for the device it would take about that long. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from trainguard.probe import samples


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--out", help="also write the JSON result here")
    args = p.parse_args()
    index = None
    if args.device == "cuda":
        torch.ones(1, device="cuda")  # the training process has a context by now
        index = torch.cuda.current_device()
    process = samples.own_process()
    samples.memory_sample(process, index)
    times = []
    for _ in range(args.calls):
        t0 = time.perf_counter()
        samples.memory_sample(process, index)
        times.append(time.perf_counter() - t0)
    result = {
        "device": torch.cuda.get_device_name() if index is not None else "cpu",
        "torch": torch.__version__,
        "sample_keys": sorted(samples.memory_sample(process, index)),
        "median_us": round(1e6 * statistics.median(times), 2),
        "p99_us": round(1e6 * sorted(times)[int(0.99 * len(times))], 2),
        "cost_per_second_at_20_hz_pct": round(100 * 20 * statistics.median(times), 4),
    }
    if index is not None:
        torch.cuda.set_sync_debug_mode("error")  # a torch-level sync in the sample raises
        busy = torch.cuda.Event(enable_timing=False)
        torch.cuda._sleep(int(2e9))  # ~1 s of device time on a ~2 GHz clock
        busy.record()
        t0 = time.perf_counter()
        samples.memory_sample(process, index)
        while_busy = time.perf_counter() - t0
        still_busy = not busy.query()
        torch.cuda.set_sync_debug_mode(0)
        t1 = time.perf_counter()
        busy.synchronize()
        result.update({
            "sample_while_device_busy_ms": round(1000 * while_busy, 3),
            "device_still_busy_after_sample": still_busy,
            "device_busy_remaining_ms": round(1000 * (time.perf_counter() - t1), 1),
        })
    line = json.dumps(result)
    print(line)
    if args.out:
        Path(args.out).write_text(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
