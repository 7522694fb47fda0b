"""The probe's overhead with 4 ranks on the CPU: DDP over gloo, guarded against unguarded, in the same job.

    python benchmarks/ranks_overhead.py [--ranks 4] [--rounds 12] [--block 20] [--out results/ranks_overhead_cpu.json]

The script starts itself under torchrun (`--nproc_per_node=RANKS`, gloo). Every rank trains three identical
DDP copies of one small MLP (same seed, same data): G, guarded (`trainguard.watch`, `guard.step(loss)` each
step, the loss all-reduced for logging through `torch.distributed.all_reduce`, which the probe numbers);
U, the same loop unguarded (its all-reduce calls the original, unwrapped function); C, a second unguarded
copy, the harness's own noise. Each round runs one block of `--block` steps of each side, in an order that
rotates through the six orders, every block framed by barriers so all ranks time the same work, with a
pause after it (the probe's 0.2 s commit cycle ends there, not in the next side's block). A block's time
is the slowest rank's (an all-reduce of MAX). The ratio G/U (and C/U) of total times comes with a 95%
bootstrap interval over rounds and a t-interval of per-round ratios (`fair_overhead.ratio_figures`).
Prints one JSON line (rank 0) and writes it to --out.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from fair_overhead import probe_thread_cpu, ratio_figures, step_figures  # noqa: E402  (the fair harness's)

SIDES = ("G", "U", "C")


def launch(args: argparse.Namespace) -> int:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TRAINGUARD_RUN_DIR": tempfile.mkdtemp(prefix="ranks-overhead-")}
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={args.ranks}", "--standalone",
           __file__, "--child", "--rounds", str(args.rounds), "--block", str(args.block), "--gap", str(args.gap),
           "--out", args.out or ""]
    return subprocess.call(cmd, env=env)


def child(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    original_all_reduce = dist.all_reduce  # U and C call this one; G's goes through the probe's numbering

    def make() -> tuple:
        torch.manual_seed(0)
        model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1)))
        return model, torch.optim.AdamW(model.parameters(), lr=1e-3)

    sides = {s: make() for s in SIDES}
    import trainguard

    total = (args.rounds + 1) * args.block
    guard = trainguard.watch(sides["G"][0], sides["G"][1], total_steps=total)
    gen = torch.Generator().manual_seed(rank)
    xs = [torch.randn(32, 64, generator=gen) for _ in range(8)]
    batches = [(x, x[:, :8].sum(1, keepdim=True)) for x in xs]  # learnable: a healthy run, no finding
    on_thread = [0.0]  # seconds in guard.step on the training thread (G only)

    def block(side: str, n: int, steps: list[float]) -> float:
        model, opt = sides[side]
        reduce = dist.all_reduce if side == "G" else original_all_reduce
        dist.barrier()
        t0 = time.perf_counter()
        for i in range(n):
            ts = time.perf_counter()
            x, y = batches[i % len(batches)]
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if side == "G":
                tg = time.perf_counter()
                guard.step(loss)
                on_thread[0] += time.perf_counter() - tg
            logged = loss.detach().clone()
            reduce(logged)  # the loss averaged for logging, as scripts do
            steps.append((time.perf_counter() - ts) * 1000)
        mine = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        original_all_reduce(mine, op=dist.ReduceOp.MAX)  # the block took as long as its slowest rank
        time.sleep(args.gap)
        return float(mine)

    warm: list[float] = []
    for s in SIDES:
        block(s, max(5, args.block // 2), warm)
    on_thread[0] = 0.0
    cpu0 = probe_thread_cpu()
    totals: dict[str, list[float]] = {s: [] for s in SIDES}
    step_ms: dict[str, list[float]] = {s: [] for s in SIDES}
    orders = list(itertools.permutations(SIDES))
    for r in range(args.rounds):
        for s in orders[r % len(orders)]:
            totals[s].append(block(s, args.block, step_ms[s]))
    background = probe_thread_cpu() - cpu0
    steps_g = args.rounds * args.block
    guard.finish()
    if rank == 0:
        result = {
            "what": f"probe overhead, {world} ranks, DDP over gloo on the CPU",
            "ranks": world, "rounds": args.rounds, "block_steps": args.block,
            "cpu_count": os.cpu_count(), "load_avg_1m": os.getloadavg()[0],
            "guarded_over_unguarded": ratio_figures(totals["U"], totals["G"]),
            "control_over_unguarded": ratio_figures(totals["U"], totals["C"]),
            "step_ms_rank0": {s: step_figures(v) for s, v in step_ms.items()},
            "guard_step_ms_on_thread_rank0": round(1000 * on_thread[0] / steps_g, 4),
            "probe_thread_cpu_ms_per_step_rank0": round(1000 * background / steps_g, 4),
            "torch": torch.__version__,
        }
        line = json.dumps(result)
        print(line, flush=True)
        if args.out:
            Path(args.out).write_text(line + "\n")
    dist.destroy_process_group()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--rounds", type=int, default=12, help="rounds of one block per side (G, U, C)")
    p.add_argument("--block", type=int, default=20, help="optimizer steps per block")
    p.add_argument("--gap", type=float, default=0.5, help="seconds of pause after every block")
    p.add_argument("--out", default=None, help="also write the JSON line here")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args)
        return 0
    return launch(args)


if __name__ == "__main__":
    sys.exit(main())
