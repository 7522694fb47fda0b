"""The probe's overhead with several ranks: DDP guarded against unguarded, in the same job.

    python benchmarks/ranks_overhead.py [--ranks 4] [--rounds 12] [--block 20] [--out results/ranks_overhead_cpu.json]
    python benchmarks/ranks_overhead.py --device cuda --ranks 2 [--rounds 120] [--seconds 170]   # one GPU a rank

The script starts itself under torchrun (`--nproc_per_node=RANKS`). On the CPU (the default): gloo, a small
MLP. With `--device cuda`: NCCL, one GPU a rank, GPT-2 small's shape (TinyLM: 12 layers, 768 wide, 12
heads, vocabulary 50304, context 512, micro-batch 16, one micro-batch a step), bf16 autocast, fused AdamW,
gradient clipping, as fair_overhead.py's GPU arm trains it, with DDP over NCCL around it. Every rank
trains three identical DDP copies (same seed, same data): G, guarded (`trainguard.watch`, `guard.step(loss)`
each step, the loss all-reduced for logging through `torch.distributed.all_reduce`, which the probe
numbers); U, the same loop unguarded (its all-reduce calls the original, unwrapped function); C, a second
unguarded copy, the harness's own noise. Each round runs one block of `--block` steps of each side, in an
order that rotates through the six orders, every block framed by barriers (and, on a GPU, synchronizes)
so all ranks time the same work, with a pause after it (the probe's background cycle ends there, not in
the next side's block). A block's time is the slowest rank's (an all-reduce of MAX). The ratio G/U (and
C/U) of total times comes with a 95% bootstrap interval over rounds and a t-interval of per-round ratios
(`fair_overhead.ratio_figures`). On a GPU the blocks run under `torch.cuda.set_sync_debug_mode("warn")`
and the synchronisations each side made are counted. `--seconds` bounds the timed rounds (rank 0 decides
when to stop; every rank stops at the same round). Prints one JSON line (rank 0) and writes it to --out.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from fair_overhead import probe_thread_cpu, ratio_figures, step_figures  # noqa: E402  (the fair harness's)

SIDES = ("G", "U", "C")
# GPT-2 small's shape, as fair_overhead.py's GPU arm (micro-batch 16, one micro-batch a step here)
GPT2 = dict(vocab=50304, dim=768, layers=12, heads=12, ctx=512, micro=16)


def launch(args: argparse.Namespace) -> int:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TRAINGUARD_RUN_DIR": tempfile.mkdtemp(prefix="ranks-overhead-")}
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={args.ranks}", "--standalone",
           __file__, "--child", "--device", args.device, "--rounds", str(args.rounds), "--block", str(args.block),
           "--gap", str(args.gap), "--seconds", str(args.seconds), "--micro", str(args.micro), "--out", args.out or ""]
    return subprocess.call(cmd, env=env)


class CpuJob:
    """The CPU's job: gloo, a small MLP on regression batches, one thread a rank."""

    backend, cuda = "gloo", False

    def __init__(self, rank: int, args: argparse.Namespace) -> None:
        import torch

        torch.set_num_threads(1)
        self.device = torch.device("cpu")
        gen = torch.Generator().manual_seed(rank)
        xs = [torch.randn(32, 64, generator=gen) for _ in range(8)]
        self.batches = [(x, x[:, :8].sum(1, keepdim=True)) for x in xs]  # learnable: a healthy run, no finding

    def make(self) -> tuple:
        import torch
        from torch.nn.parallel import DistributedDataParallel as DDP

        torch.manual_seed(0)
        model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1)))
        return model, torch.optim.AdamW(model.parameters(), lr=1e-3)

    def loss(self, model, i: int):
        import torch

        x, y = self.batches[i % len(self.batches)]
        return torch.nn.functional.mse_loss(model(x), y)

    def after_backward(self, model) -> None:
        pass

    def sync(self) -> None:
        pass

    def describe(self) -> dict:
        return {"what": "probe overhead, DDP over gloo on the CPU"}


class GpuJob:
    """One GPU a rank over NCCL: GPT-2 small's shape, bf16 autocast, clipping, fused AdamW; batches of a
    learnable text (byte tokens) made on the device once, so the loop reads nothing from the host."""

    backend, cuda = "nccl", True

    def __init__(self, rank: int, args: argparse.Namespace) -> None:
        import torch

        from trainguard.demo.tinylm import corpus

        self.device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(self.device)
        self.shape = {**GPT2, "micro": args.micro}
        ctx, micro = self.shape["ctx"], self.shape["micro"]
        data = corpus(repeat=400)
        gen = torch.Generator().manual_seed(rank)
        self.batches = []
        for _ in range(8):
            ix = torch.randint(len(data) - ctx - 1, (micro,), generator=gen)
            x = torch.stack([data[j: j + ctx] for j in ix]).to(self.device)
            y = torch.stack([data[j + 1: j + 1 + ctx] for j in ix]).to(self.device)
            self.batches.append((x, y))
        self.amp = torch.autocast("cuda", dtype=torch.bfloat16)

    def make(self) -> tuple:
        import torch
        from torch.nn.parallel import DistributedDataParallel as DDP

        from trainguard.demo.tinylm import TinyLM

        s = self.shape
        torch.manual_seed(0)
        net = TinyLM(vocab=s["vocab"], dim=s["dim"], layers=s["layers"], heads=s["heads"], ctx=s["ctx"]).to(self.device)
        model = DDP(net, device_ids=[self.device.index])
        return model, torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=True)

    def loss(self, model, i: int):
        import torch

        x, y = self.batches[i % len(self.batches)]
        with self.amp:
            logits = model(x)
        return torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), y.flatten())

    def after_backward(self, model) -> None:
        import torch

        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)

    def sync(self) -> None:
        import torch

        torch.cuda.synchronize()

    def describe(self) -> dict:
        import torch

        return {"what": "probe overhead, DDP over NCCL, one GPU a rank, GPT-2 small's shape, bf16",
                "shape": self.shape, "device_name": torch.cuda.get_device_name(self.device)}


def child(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    job = GpuJob(int(os.environ["RANK"]), args) if args.device == "cuda" else CpuJob(int(os.environ["RANK"]), args)
    if job.cuda:
        dist.init_process_group(job.backend, device_id=job.device)
    else:
        dist.init_process_group(job.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    original_all_reduce = dist.all_reduce  # U and C call this one; G's goes through the probe's numbering
    sides = {s: job.make() for s in SIDES}
    import trainguard

    total = (args.rounds + 1) * args.block
    guard = trainguard.watch(sides["G"][0], sides["G"][1], total_steps=total)
    on_thread = [0.0]  # seconds in guard.step on the training thread (G only)
    syncs = {s: 0 for s in SIDES}  # host-device synchronisations seen in each side's blocks (GPU)

    def block(side: str, n: int, steps: list[float]) -> float:
        model, opt = sides[side]
        reduce = dist.all_reduce if side == "G" else original_all_reduce
        dist.barrier()
        job.sync()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if job.cuda:
                torch.cuda.set_sync_debug_mode("warn")  # each synchronisation in the block is a warning
            t0 = time.perf_counter()
            for i in range(n):
                ts = time.perf_counter()
                loss = job.loss(model, i)
                loss.backward()
                job.after_backward(model)
                opt.step()
                opt.zero_grad(set_to_none=True)
                if side == "G":
                    tg = time.perf_counter()
                    guard.step(loss)
                    on_thread[0] += time.perf_counter() - tg
                logged = loss.detach().clone()
                reduce(logged)  # the loss averaged for logging, as scripts do
                steps.append((time.perf_counter() - ts) * 1000)
            if job.cuda:
                torch.cuda.set_sync_debug_mode(0)
            job.sync()
            elapsed = time.perf_counter() - t0
        syncs[side] += sum(1 for w in caught if "synchroniz" in str(w.message))
        mine = torch.tensor([elapsed], dtype=torch.float64, device=job.device)
        original_all_reduce(mine, op=dist.ReduceOp.MAX)  # the block took as long as its slowest rank
        time.sleep(args.gap)
        return float(mine)

    def go_on(started: float, rounds_done: int) -> bool:
        """Rank 0's word, the same on every rank: another round fits in --seconds (judged from the rounds
        so far) and --rounds is not reached."""
        mean = (time.perf_counter() - started) / rounds_done if rounds_done else 0.0
        fits = args.seconds <= 0 or time.perf_counter() - started + mean <= args.seconds
        flag = torch.tensor([1.0 if fits and rounds_done < args.rounds else 0.0], device=job.device)
        original_all_reduce(flag, op=dist.ReduceOp.MIN)
        return bool(flag.item())

    warm: list[float] = []
    for s in SIDES:
        block(s, max(5, args.block // 2), warm)
    on_thread[0] = 0.0
    syncs.update({s: 0 for s in SIDES})  # DDP's own bucket rebuild (step 2) syncs in the warm-up
    cpu0 = probe_thread_cpu()
    totals: dict[str, list[float]] = {s: [] for s in SIDES}
    step_ms: dict[str, list[float]] = {s: [] for s in SIDES}
    orders = list(itertools.permutations(SIDES))
    started = time.perf_counter()
    r = 0
    while go_on(started, r):
        for s in orders[r % len(orders)]:
            totals[s].append(block(s, args.block, step_ms[s]))
        r += 1
    background = probe_thread_cpu() - cpu0
    steps_g = max(1, r * args.block)
    guard.finish()
    if rank == 0:
        status = _read_json(Path(os.environ.get("TRAINGUARD_RUN_DIR", "")) / "status.json")
        result = {
            **job.describe(),
            "ranks": world, "rounds": r, "block_steps": args.block, "seconds_of_rounds": round(time.perf_counter() - started, 1),
            "cpu_count": os.cpu_count(), "load_avg_1m": os.getloadavg()[0],
            "guarded_over_unguarded": ratio_figures(totals["U"], totals["G"]) if r > 1 else None,
            "control_over_unguarded": ratio_figures(totals["U"], totals["C"]) if r > 1 else None,
            "ms_per_step": {s: round(1000 * sum(v) / steps_g, 3) for s, v in totals.items()},
            "step_ms_rank0": {s: step_figures(v) for s, v in step_ms.items()} if r else None,
            "guard_step_ms_on_thread_rank0": round(1000 * on_thread[0] / steps_g, 4),
            "probe_thread_cpu_ms_per_step_rank0": round(1000 * background / steps_g, 4),
            "sync_warnings_rank0": syncs if job.cuda else None,
            "guarded_run_findings": [f"{f.get('name')}[{f.get('severity')}]" for f in (status or {}).get("findings") or []],
            "torch": torch.__version__,
        }
        line = json.dumps(result)
        print(line, flush=True)
        if args.out:
            Path(args.out).write_text(line + "\n")
    dist.destroy_process_group()


def _read_json(path: Path) -> dict | None:
    with contextlib.suppress(OSError, ValueError):
        return json.loads(path.read_text())
    return None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="cpu: gloo, a small MLP; cuda: NCCL, one GPU a rank, GPT-2 small's shape in bf16")
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--rounds", type=int, default=12, help="rounds of one block per side (G, U, C), at most")
    p.add_argument("--seconds", type=float, default=0.0,
                   help="stop starting rounds once this many seconds of rounds are done (0: no bound)")
    p.add_argument("--block", type=int, default=20, help="optimizer steps per block")
    p.add_argument("--gap", type=float, default=0.5, help="seconds of pause after every block")
    p.add_argument("--micro", type=int, default=GPT2["micro"], help="sequences a micro-batch (--device cuda)")
    p.add_argument("--out", default=None, help="also write the JSON line here")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args)
        return 0
    return launch(args)


if __name__ == "__main__":
    sys.exit(main())
