"""The device telemetry's reader on a real card: what NVML reads, and what it costs (issue 37).

    PYTHONPATH=src python benchmarks/device_telemetry_check.py [--seconds 2.5] [--rounds 8]

Prints, for GPU 0: one sample (clocks, temperature, power, memory, throttle reasons, ECC and remap
counters), whether the Xid event set registers, whether the kernel log can be followed here; the cost
of one sample (wall and CPU, median of 200); and a training loop's step time with no sampler, with the
probe's sampler at its default interval (5 s), and at 0.1 s (50x more often: an upper bound), in
interleaved blocks with a second no-sampler arm as the control (ratios to "none" with a bootstrap interval). NVML does not touch the CUDA context: the loop is never synchronised
by the sampler (the step times say so). Ends with one JSON line of the numbers.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path


def _bootstrap_median(values: list[float], rng: random.Random, n: int = 2000) -> tuple[float, float]:
    """A 95% percentile-bootstrap interval of the median of `values`."""
    meds = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(n))
    return meds[int(0.025 * n)], meds[int(0.975 * n) - 1]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=2.5, help="seconds per block of the loop comparison")
    ap.add_argument("--rounds", type=int, default=8, help="rounds of one block per arm, interleaved")
    args = ap.parse_args()
    import torch

    from trainguard.devices.kmsg import open_kernel_log
    from trainguard.devices.nvml import Gpu
    from trainguard.devices.sampler import SAMPLE_EVERY, DeviceSampler
    from trainguard.store.writer import StoreWriter

    if not torch.cuda.is_available():
        print("no CUDA GPU here")
        return 1
    gpu = Gpu.open(index=0)
    if gpu is None:
        print("NVML could not open GPU 0 (is nvidia-ml-py installed? `pip install trainguard[gpu]`)")
        return 1
    out: dict = {"gpu": gpu.name, "pci": gpu.pci, "uuid": gpu.uuid}
    print(f"GPU 0: {gpu.name}, PCI {gpu.pci}")
    sample = gpu.sample()
    print("one sample:", json.dumps(sample))
    out["sample"] = sample

    walls, cpus = [], []
    for _ in range(200):
        t0, c0 = time.perf_counter(), time.thread_time()
        gpu.sample()
        walls.append(time.perf_counter() - t0)
        cpus.append(time.thread_time() - c0)
    out["sample_wall_ms"] = round(statistics.median(walls) * 1e3, 3)
    out["sample_cpu_ms"] = round(statistics.median(cpus) * 1e3, 3)
    print(f"one sample costs {out['sample_wall_ms']} ms wall, {out['sample_cpu_ms']} ms CPU (median of 200); "
          f"at one per {SAMPLE_EVERY:.0f} s: {100 * statistics.median(cpus) / SAMPLE_EVERY:.4f}% of one core")

    events = gpu.xid_events()
    out["xid_events_registered"] = events is not None and hex(events.registered)
    if events is not None:
        t0 = time.perf_counter()
        got = events.wait(500)
        out["xid_wait_ms"] = round((time.perf_counter() - t0) * 1e3, 1)
        print(f"Xid event set registered ({hex(events.registered)}); a 500 ms wait returned {got} after "
              f"{out['xid_wait_ms']} ms")
        events.close()
    else:
        print("Xid event set: not supported on this GPU/driver")
    klog = open_kernel_log()  # /dev/kmsg, else syslog(2), else journalctl -k -f (devices/kmsg.py)
    out["kernel_log_followed"] = klog is not None
    out["kernel_log_source"] = klog.name if klog is not None else None
    print("kernel log:", f"followed from {klog.name}" if klog is not None else "nothing readable here (no CAP_SYSLOG, "
          "no journal)")
    if klog is not None:
        klog.close()
    gpu.close()

    # -- a training loop's step time without and with the sampler ----------------------------------
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(4)]).cuda().to(torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    x = torch.randn(2048, 4096, device="cuda", dtype=torch.bfloat16)

    def arm(seconds: float) -> float:
        for _ in range(5):
            step()
        torch.cuda.synchronize()
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            step()
            n += 1
            if n % 20 == 0:
                torch.cuda.synchronize()
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) / n * 1e3

    def step() -> None:
        loss = model(x).float().pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    # interleaved blocks, the order shuffled each round, so drift (clocks, temperature, neighbours) falls on
    # every arm alike; "control" is a second no-sampler arm: the spread between it and "none" is the noise
    # floor a sampler's cost has to be read against. Per round, each arm's step time over "none"'s.
    arms = {"none": None, "control": None, f"every {SAMPLE_EVERY:.0f} s": SAMPLE_EVERY, "every 0.1 s": 0.1}
    times: dict[str, list[float]] = {label: [] for label in arms}
    counts: dict[str, dict[str, float]] = {label: {"samples": 0, "events": 0, "sampler_cpu_s": 0.0} for label in arms}
    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            order = list(arms)
            rng.shuffle(order)
            for label in order:
                every = arms[label]
                folder = Path(tmp) / f"{r}_{label.replace(' ', '_')}"
                folder.mkdir()
                writer = StoreWriter(folder, rank=0)
                sampler = DeviceSampler(writer, rank=0, local_rank=0, log=print, every=every).start() if every else None
                times[label].append(arm(args.seconds))
                if sampler is not None:
                    sampler.stop()
                    counts[label]["samples"] += sampler.samples
                    counts[label]["events"] += sampler.events
                    counts[label]["sampler_cpu_s"] += sampler.cpu_s
                writer.close()
    results: dict[str, dict] = {}
    for label in arms:
        ratios = [t / b for t, b in zip(times[label], times["none"])]
        lo, hi = _bootstrap_median(ratios, rng)
        results[label] = {"step_ms_median": round(statistics.median(times[label]), 4),
                          "ratio_median": round(statistics.median(ratios), 5), "ratio_ci95": [round(lo, 5), round(hi, 5)],
                          **({k: round(v, 4) for k, v in counts[label].items()} if arms[label] else {})}
        print(f"loop, sampler {label}: {results[label]}")
    out["loop"] = results
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
