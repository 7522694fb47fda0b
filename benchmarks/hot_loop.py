"""The fair harness's loop alone, guarded or not, for a sampling profiler: where the probe's time goes.

    python benchmarks/hot_loop.py --arm launch --steps 1500              # guarded (the whole API)
    python benchmarks/hot_loop.py --arm launch --steps 1500 --unguarded
    py-spy record -r 1000 -f raw -o g.raw -- python benchmarks/hot_loop.py --arm launch
    python benchmarks/hot_loop.py --share g.raw                          # the probe's share, by entry point

`fair_overhead.py` times the probe's calls from outside (a timer around each call and hook) and compares
whole blocks; a sampling profiler sees inside them without adding a cost per call. The loop is that
harness's own (its `Side` and `training`, imported), as a user calls the API: micro-batches with `guard.batches`, `guard.step(loss, parts=..., weights=...)`, clipping, the optimizer
and scheduler, `due("eval")` with an evaluation in `phase("eval")`, all in `phase("train")`. It prints the
training thread's CPU and wall time per optimizer step. `--share` reads py-spy's raw (collapsed) output:
of the training thread's samples, the share under each trainguard function the loop or torch called
(the loader's own work under `guard.batches` is the loop's, not the probe's), and the deepest trainguard
function under each.
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
import tempfile
import time


def train(args: argparse.Namespace) -> None:
    """fair_overhead.py's guarded arm alone (its `Side` and `training`, `--timing off`'s calls), or its
    unguarded arm."""
    import torch
    from fair_overhead import ARMS, Side, training

    import trainguard
    from trainguard.demo.tinylm import corpus

    cfg = dict(ARMS[args.arm])
    cuda = cfg["device"] == "cuda"
    if not cuda:
        torch.set_num_threads(cfg["threads"])
    side = Side("U" if args.unguarded else "G", cfg, corpus(repeat=2000) % cfg["vocab"])
    if not args.unguarded:
        side.guard = trainguard.watch(side.model, side.opt, side.sched, total_steps=100_000, grad_accum=cfg["accum"],
                                      run_dir=tempfile.mkdtemp(prefix="tg-hot-"))
    loop = training(side, [0])
    for _ in range(args.warmup):
        next(loop)
    if cuda:
        torch.cuda.synchronize()
    t0, c0 = time.perf_counter(), time.thread_time()
    for _ in range(args.steps):
        next(loop)
    if cuda:
        torch.cuda.synchronize()
    wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
    print(f"{side.name} {args.arm}: {1000 * cpu / args.steps:.3f} ms thread CPU, "
          f"{1000 * wall / args.steps:.3f} ms wall per optimizer step ({args.steps} steps)", flush=True)
    if side.guard is not None:
        side.guard.finish()


def share(path: str, top: int = 30) -> None:
    """The probe's share of the training thread's samples in py-spy's raw output, by entry point."""
    def name(frame: str) -> str:
        return re.sub(r" \(.*", "", frame)

    def ours(frame: str) -> bool:
        return "trainguard/" in frame and "/demo/" not in frame

    total = 0
    entries: collections.Counter[str] = collections.Counter()
    deepest: collections.Counter[str] = collections.Counter()
    for line in open(path):
        stack, _, count = line.rstrip().rpartition(" ")
        frames = stack.split(";")
        if not any(f.startswith("training (") and "fair_overhead.py" in f for f in frames):
            continue  # another thread: the training thread is the one inside the harness's loop
        n = int(count)
        total += n
        at = [i for i, f in enumerate(frames) if ours(f)]
        if not at or any("fair_overhead.py" in f for f in frames[at[0] + 1:]):
            continue  # not the probe, or the loop's own code called back from it (the loader in batches)
        entries[name(frames[at[0]])] += n
        deepest[f"{name(frames[at[0]])} > {name(frames[at[-1]])}"] += n
    probe = sum(entries.values())
    print(f"training thread: {total} samples, the probe's: {probe} ({100 * probe / max(1, total):.2f}%)")
    for key, n in entries.most_common():
        print(f"{100 * n / total:6.2f}%  {key}")
    print("deepest trainguard function under each:")
    for key, n in deepest.most_common(top):
        print(f"{100 * n / total:6.2f}%  {key}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arm", default="launch-cpu", help="one of fair_overhead.py's arms (launch, launch-cpu, cpu, gpu, tiny)")
    p.add_argument("--steps", type=int, default=1500, help="optimizer steps timed")
    p.add_argument("--warmup", type=int, default=30, help="optimizer steps before the timing starts")
    p.add_argument("--unguarded", action="store_true")
    p.add_argument("--share", metavar="RAW", help="read py-spy's raw output instead of training")
    args = p.parse_args()
    if args.share:
        share(args.share)
    else:
        train(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
