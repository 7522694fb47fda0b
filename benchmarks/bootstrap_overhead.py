"""The automatic probe's overhead on an unmodified loop (`trainguard run`'s start-up bootstrap), as ratios.

    python benchmarks/bootstrap_overhead.py                  # CPU: a small transformer LM
    python benchmarks/bootstrap_overhead.py --device cuda    # GPU: a GPT-2-small-shaped step in bf16

Two figures, each a ratio with a 95% bootstrap interval over alternating rounds:

1. Start-up: `python -c "pass"` with the bootstrap on PYTHONPATH (what every Python process of a watched
   command pays once: importing the bootstrap, the stack-dump handler, the import finder) against without
   it, alternated run by run (`--startup-code "import torch"` for a process that imports torch: the
   global optimizer hooks are registered then).
2. Training: one child process started with the bootstrap, as `trainguard run` starts a command, trains
   two identical models with two optimizers, in alternating blocks (A B A B ...). The script has no
   trainguard in it: the automatic probe attaches itself to the first optimizer that steps (A) and B
   stays unwatched, with torch's global hook list the same for both; the ratio is A's total time over
   B's. The child also reports the probe's background thread CPU, and checks the probe recorded A's steps.

Prints one JSON line (and writes it to --out).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

CHILD = r'''
import json, os, sys, time
sys.path.insert(0, {here!r})
import torch
from overhead import build, make_step, timed_block, _thread_cpu

class Args: pass
args = Args()
args.__dict__.update({args!r})
if args.device == "cpu":
    torch.set_num_threads(args.threads)
dims = (128, 2, 4) if args.device == "cpu" else (768, 12, 12)
sides = []
for seed in (0, 0):  # identical models: A (stepped first: the automatic probe takes it) and B
    model, opt, sched = build(args.device, *dims, args.ctx, seed=seed)
    gen = torch.Generator().manual_seed(1)
    from trainguard.demo.tinylm import corpus
    data = corpus() if args.device == "cpu" else None
    sides.append(make_step(model, opt, sched, data, args, gen))
step_a, step_b = sides
step_a()  # the first optimizer step of the process: the automatic probe starts here, on A's optimizer
from trainguard.probe import auto
guard = auto._state["guard"]
assert guard is not None, "the bootstrap did not start the automatic probe"
for _ in range(args.warmup):
    step_a(); step_b()
a, b = [], []
cpu0 = _thread_cpu(guard)
for r in range(args.rounds):
    order = [(step_a, a), (step_b, b)] if r % 2 == 0 else [(step_b, b), (step_a, a)]
    for fn, out in order:
        out.append(timed_block(fn, args.block, args.device))
cpu = _thread_cpu(guard) - cpu0
print(json.dumps({{"a": a, "b": b, "probe_steps": guard.opt_steps, "thread_cpu_s": cpu}}))
'''


def ratio_ci(base: list[float], test: list[float], draws: int = 5000) -> tuple[float, list[float]]:
    """sum(test)/sum(base) and its 95% interval from resampling whole rounds (pairs)."""
    rng = random.Random(0)
    pairs = list(zip(base, test))
    figures = []
    for _ in range(draws):
        pick = [pairs[rng.randrange(len(pairs))] for _ in pairs]
        figures.append(sum(t for _, t in pick) / sum(b for b, _ in pick))
    figures.sort()
    return sum(test) / sum(base), [round(figures[int(0.025 * draws)], 4), round(figures[int(0.975 * draws)], 4)]


def env_with(bootstrap: bool, run_dir: str) -> dict[str, str]:
    from trainguard.probe.auto import bootstrap_env

    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINGUARD_") and k != "PYTHONDONTWRITEBYTECODE"}
    # bytecode cached (in a folder of the benchmark's own), as an installed package has it: without it,
    # every start would compile trainguard's modules again (PYTHONDONTWRITEBYTECODE=1 on some machines)
    env["PYTHONPYCACHEPREFIX"] = str(Path(run_dir).parent / "pycache")
    if bootstrap:
        env.update(bootstrap_env(env))
        env.update({"TRAINGUARD_RUN_DIR": run_dir, "TRAINGUARD_WATCHDOG": "1"})
    return env


def startup(runs: int, tmp: str, code: str) -> dict:
    plain, boot = [], []
    for on in (False, True):  # untimed: fills the bytecode cache
        subprocess.run([sys.executable, "-c", code], env=env_with(on, f"{tmp}/warm"), check=True)
    for i in range(runs):
        for on in ((False, True) if i % 2 == 0 else (True, False)):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-c", code], env=env_with(on, f"{tmp}/start{i}"), check=True)
            (boot if on else plain).append(time.perf_counter() - t0)
    r, ci = ratio_ci(plain, boot)
    return {"code": code, "runs": runs, "median_plain_s": round(statistics.median(plain), 4),
            "median_bootstrap_s": round(statistics.median(boot), 4), "ratio": round(r, 4), "ratio_ci95": ci}


def training(args: argparse.Namespace, tmp: str) -> dict:
    child_args = {"device": args.device, "threads": args.threads, "rounds": args.rounds, "block": args.block,
                  "warmup": args.warmup, "grad_accum": 1, "amp": args.amp, "ctx": args.ctx,
                  "batch_size": args.batch_size}
    code = CHILD.format(here=str(HERE), args=child_args)
    run_dir = f"{tmp}/train"
    out = subprocess.run([sys.executable, "-c", code], env=env_with(True, run_dir), capture_output=True, text=True,
                         check=False)
    if out.returncode != 0:
        raise SystemExit(f"child failed:\n{out.stderr[-3000:]}")
    got = json.loads(out.stdout.strip().splitlines()[-1])
    a, b = got["a"], got["b"]
    r, ci = ratio_ci(b, a)
    steps = args.rounds * args.block
    with sqlite3.connect(f"{run_dir}/run.db") as db:
        stored = db.execute("select count(*) from steps").fetchone()[0]
    return {"device": args.device, "rounds": args.rounds, "block": args.block,
            "step_ms_unwatched": round(1000 * sum(b) / steps, 3), "step_ms_watched": round(1000 * sum(a) / steps, 3),
            "ratio": round(r, 4), "ratio_ci95": ci,
            "round_ratios": [round(x / y, 3) for x, y in zip(a, b)],
            "probe_thread_cpu_ms_per_step": round(1000 * got["thread_cpu_s"] / steps, 4),
            "probe_steps_counted": got["probe_steps"], "rows_stored": stored}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--rounds", type=int, default=8, help="A/B rounds of training blocks")
    p.add_argument("--block", type=int, default=30, help="optimizer steps per block")
    p.add_argument("--warmup", type=int, default=10, help="untimed steps per side first")
    p.add_argument("--startup-runs", type=int, default=20, help="interpreter starts per side")
    p.add_argument("--startup-code", default="pass", help="what each started interpreter runs")
    p.add_argument("--threads", type=int, default=min(4, os.cpu_count() or 1), help="torch CPU threads")
    p.add_argument("--only", choices=["startup", "training"], help="measure one of the two figures")
    p.add_argument("--out", help="also write the JSON result here")
    args = p.parse_args()
    args.amp = "bf16" if args.device == "cuda" else "none"
    args.ctx = 64 if args.device == "cpu" else 512
    args.batch_size = 16 if args.device == "cpu" else 8
    with tempfile.TemporaryDirectory(prefix="tg-bootstrap-") as tmp:
        result = {"benchmark": "bootstrap_overhead", "python": sys.version.split()[0]}
        if args.only in (None, "startup"):
            result["startup"] = startup(args.startup_runs, tmp, args.startup_code)
        if args.only in (None, "training"):
            result["training"] = training(args, tmp)
    line = json.dumps(result)
    print(line)
    if args.out:
        Path(args.out).write_text(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
