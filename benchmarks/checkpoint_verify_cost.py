"""The cost of verifying a checkpoint (issue 37): a real 1 GB checkpoint of many tensors, verified by the
product's own verifier (checkpoints/verifier.py: its low-priority child, `python -m trainguard.checkpoints.verify`,
started, watched and judged exactly as a run's probe or watchdog does), and a training loop's step time with and
without a verification running beside it.

    PYTHONPATH=src python benchmarks/checkpoint_verify_cost.py [--gb 1] [--tensors 384] [--repeats 5] [--out r.json]

Per format (torch.save, and safetensors where the package is installed):
- the verification's wall time (submit to verdict, as the run sees it), the child's own time and CPU seconds,
  and its peak memory: VmHWM from the child's /proc status (its resident high-water mark, mapped checkpoint
  pages included; not ru_maxrss, which survives exec and would report the parent's peak) and the parent's
  sampled RssAnon peak (what the verifier's memory limit watches);
- the step time of a CPU training loop in this process (an MLP, `--train-threads` threads) while a verification
  runs beside it, against the same loop just before with none: median step time during / median before, per
  repeat, and its mean with a 95 % bootstrap interval over repeats. A verification is submitted at the start of
  each "beside" block and the block lasts until its verdict.

The file was just written, so its pages are in the page cache, as they are right after a save (the case the
product verifies); a cold read from a slow disk takes longer, at the disk's speed, in the idle I/O class.
The machine's load average and core count are printed beside the figures: on a shared machine they matter.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def make_state(gb: float, tensors: int) -> dict[str, Any]:
    import torch

    per = int(gb * (1 << 30) / 4 / tensors)  # float32 elements per tensor
    side = max(1, int(per ** 0.5))
    g = torch.Generator().manual_seed(0)
    return {f"layers.{i}.weight": torch.randn(side, per // side, generator=g) for i in range(tensors)}


def save(state: dict[str, Any], folder: Path, fmt: str, step: int) -> Path:
    import torch

    if fmt == "torch":
        path = folder / f"step-{step}.pt"
        torch.save({"model": state, "step": step}, path)
    else:
        from safetensors.torch import save_file

        path = folder / f"step-{step}.safetensors"
        save_file(state, str(path), metadata={"step": str(step)})
    os.sync()  # (the write-back of the file must not fall inside the timed blocks)
    return path


class Loop:
    """A CPU training loop: an MLP, AdamW, one step per call."""

    def __init__(self, threads: int, width: int = 1024, batch: int = 64) -> None:
        import torch

        torch.set_num_threads(threads)
        torch.manual_seed(0)
        self.torch = torch
        self.model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(),
                                         torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, 1))
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.x = torch.randn(batch, width)
        self.y = torch.randn(batch, 1)

    def step(self) -> float:
        t0 = time.perf_counter()
        loss = (self.model(self.x) - self.y).pow(2).mean()
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        return time.perf_counter() - t0


def steps_for(loop: Loop, seconds: float) -> list[float]:
    out: list[float] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        out.append(loop.step())
    return out


def bootstrap_mean(values: list[float], n: int = 4000) -> tuple[float, float]:
    rng = random.Random(0)
    means = sorted(statistics.fmean(rng.choices(values, k=len(values))) for _ in range(n))
    return means[int(0.025 * n)], means[int(0.975 * n) - 1]


def run_format(fmt: str, state: dict[str, Any], folder: Path, loop: Loop, repeats: int, baseline_s: float
               ) -> dict[str, Any]:
    from trainguard.checkpoints.verifier import Verifier

    verdicts: list[dict[str, Any]] = []
    verifier = Verifier(record=lambda path, step, data: verdicts.append(data))
    out: dict[str, Any] = {"format": fmt, "repeats": []}
    for r in range(repeats):
        step = 1000 * (r + 1)
        for t in state.values():  # the run moved: every tensor differs from the previous checkpoint's
            t.view(-1)[0] += 1.0
        path = save(state, folder, fmt, step)
        size = path.stat().st_size
        before = steps_for(loop, baseline_s)
        n = len(verdicts)
        t0 = time.perf_counter()
        verifier.submit(path, at_step=step)
        beside: list[float] = []
        while len(verdicts) == n:
            beside.append(loop.step())
            if time.perf_counter() - t0 > 900:
                raise SystemExit("no verdict within 900 s")
        wall = time.perf_counter() - t0
        v = verdicts[-1]
        ratio = statistics.median(beside) / statistics.median(before)
        rep = {"bytes": size, "status": v.get("status"), "why": v.get("why"), "tensors": v.get("tensors"),
               "wall_s": round(wall, 3), "verifier_wall_s": v.get("wall_s"), "child_s": v.get("seconds"),
               "child_cpu_s": v.get("cpu_s"), "child_vmhwm_mb": v.get("peak_rss_mb"),
               "child_peak_anon_mb": v.get("peak_anon_mb"), "steps_before": len(before),
               "steps_beside": len(beside), "step_ms_before": round(1e3 * statistics.median(before), 2),
               "step_ms_beside": round(1e3 * statistics.median(beside), 2), "step_ratio": round(ratio, 4)}
        out["repeats"].append(rep)
        print(json.dumps({"format": fmt, "repeat": r, **rep}), file=sys.stderr, flush=True)
        path.unlink()
    verifier.stop()
    reps = out["repeats"]
    ratios = [x["step_ratio"] for x in reps]
    lo, hi = bootstrap_mean(ratios)
    out["summary"] = {
        "gb": round(reps[0]["bytes"] / (1 << 30), 3), "verified": all(x["status"] == "verified" for x in reps),
        "wall_s_median": statistics.median(x["wall_s"] for x in reps),
        "child_cpu_s_median": statistics.median(x["child_cpu_s"] or 0 for x in reps),
        "child_vmhwm_mb_max": max(x["child_vmhwm_mb"] or 0 for x in reps),
        "child_peak_anon_mb_max": max(x["child_peak_anon_mb"] or 0 for x in reps),
        "step_ratio_mean": round(statistics.fmean(ratios), 4), "step_ratio_ci95": [round(lo, 4), round(hi, 4)],
    }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gb", type=float, default=1.0, help="checkpoint size in GiB of float32 tensors")
    ap.add_argument("--tensors", type=int, default=384, help="how many tensors it holds")
    ap.add_argument("--repeats", type=int, default=5, help="verifications per format")
    ap.add_argument("--baseline-s", type=float, default=4.0, help="seconds of the loop with no verification, "
                    "before each one")
    ap.add_argument("--train-threads", type=int, default=1, help="torch threads of the training loop")
    ap.add_argument("--formats", default="torch,safetensors", help="comma-separated: torch, safetensors")
    ap.add_argument("--dir", default=None, help="where the checkpoints are written (default: a temp folder)")
    ap.add_argument("--out", default=None, help="also write the JSON here")
    args = ap.parse_args()
    import importlib.util

    import torch

    formats = [f for f in args.formats.split(",") if f]
    if "safetensors" in formats and importlib.util.find_spec("safetensors") is None:
        print("safetensors is not installed: torch format only", file=sys.stderr)
        formats.remove("safetensors")
    state = make_state(args.gb, args.tensors)
    loop = Loop(args.train_threads)
    steps_for(loop, 2.0)  # warm-up
    result: dict[str, Any] = {
        "benchmark": "checkpoint_verify_cost", "torch": torch.__version__, "cpus": os.cpu_count(),
        "affinity": len(os.sched_getaffinity(0)), "nice": os.nice(0), "train_threads": args.train_threads,
        "load_avg_before": os.getloadavg(), "tensors": args.tensors, "formats": []}
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="tg-ckpt-cost-") as tmp:
        for fmt in formats:
            result["formats"].append(run_format(fmt, state, Path(tmp), loop, args.repeats, args.baseline_s))
    result["load_avg_after"] = os.getloadavg()
    text = json.dumps(result)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
