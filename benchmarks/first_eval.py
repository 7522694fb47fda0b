"""The first evaluation of a guarded run: timed, and every thread's stack sampled while it runs.

    python benchmarks/first_eval.py --arm gpu                 # contract checks on
    TRAINGUARD_CONTRACTS=0 python benchmarks/first_eval.py --arm gpu
    python benchmarks/first_eval.py --arm gpu --first U       # the unguarded copy evaluates first
    python benchmarks/first_eval.py --arm gpu --eval-every 25 # the first evaluation on a step that is not sampled

`fair_overhead.py`'s GPU-bound arm showed one guarded step 6-9x slower than its unguarded twin: the step
that holds the run's first evaluation (843 ms against 92 ms with the contract checks on, 140 ms with
them off). This script trains two copies of that arm's model with that arm's loop, G guarded (the whole
API) and U not, in one process, to their first evaluation, and times the steps around it. While each
copy runs the step that holds its first evaluation, a sampler thread records every thread's Python
stack each millisecond; the report lists the frames where the most samples fell (the training thread's,
and the other threads'), the gaps between samples (the sampler needs the interpreter lock: a long gap
is the training thread holding it in C), the garbage collector's pauses and, on CUDA, the caching
allocator's device allocations and retries in that step. One JSON line; the order of the copies and the
step of the first evaluation are arguments, the contract checks are switched off by
TRAINGUARD_CONTRACTS=0 (run each case in a fresh process: the stall happens once per process).
"""

from __future__ import annotations

import argparse
import collections
import gc
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fair_overhead import ARMS, OnThread, Side, training  # noqa: E402  (the same model and loop)


class Sampler:
    """Every thread's stack each `period` seconds, while `on`."""

    def __init__(self, main_id: int, period: float = 0.001, depth: int = 14) -> None:
        self.main_id, self.period, self.depth = main_id, period, depth
        self.active = threading.Event()  # set while sampling: the thread sleeps on it otherwise
        self.stop = False
        self.samples: list[tuple[float, dict[int, tuple[str, ...]]]] = []
        self.thread = threading.Thread(target=self.run, name="first-eval-sampler", daemon=True)
        self.thread.start()

    def stack(self, frame) -> tuple[str, ...]:
        out = []
        while frame is not None and len(out) < self.depth:
            code = frame.f_code
            out.append(f"{Path(code.co_filename).name}:{frame.f_lineno} {code.co_name}")
            frame = frame.f_back
        return tuple(out)

    def run(self) -> None:
        me = threading.get_ident()
        while not self.stop:
            self.active.wait()
            frames = sys._current_frames()
            self.samples.append((time.perf_counter(), {tid: self.stack(f) for tid, f in frames.items()
                                                      if tid != me}))
            time.sleep(self.period)

    def report(self, names: dict[int, str]) -> dict:
        times = [t for t, _ in self.samples]
        gaps = sorted((round(1000 * (b - a), 2) for a, b in zip(times, times[1:])), reverse=True)[:8]
        leaf: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        whole: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        for _, stacks in self.samples:
            for tid, st in stacks.items():
                who = "training" if tid == self.main_id else names.get(tid, str(tid))
                if st:
                    leaf[who][st[0]] += 1
                    whole[who][" < ".join(st[:8])] += 1
        return {
            "samples": len(self.samples), "largest_gaps_ms": gaps,
            "top_frames": {who: c.most_common(8) for who, c in leaf.items()},
            "top_stacks": {who: c.most_common(4) for who, c in whole.items()},
        }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arm", choices=sorted(ARMS), default="gpu")
    p.add_argument("--eval-every", type=int, help="optimizer steps between evaluations (default: the arm's)")
    p.add_argument("--first", choices=["G", "U"], default="G", help="which copy reaches its first evaluation first")
    p.add_argument("--after", type=int, default=3, help="steps timed after the evaluation's step")
    p.add_argument("--out", help="also write the JSON here")
    args = p.parse_args()
    import torch

    cfg = dict(ARMS[args.arm])
    if args.eval_every:
        cfg["eval_every"] = args.eval_every
    cuda = cfg["device"] == "cuda"
    if not cuda:
        torch.set_num_threads(cfg["threads"])
    from trainguard.demo.tinylm import corpus

    data = corpus(repeat=2000) % cfg["vocab"]
    sides = {name: Side(name, cfg, data) for name in ("G", "U")}
    G = sides["G"]
    G.timer = OnThread()
    import trainguard

    G.guard = trainguard.watch(G.model, G.opt, G.sched, total_steps=100_000, grad_accum=cfg["accum"],
                               run_dir=Path(tempfile.mkdtemp(prefix="tg-first-eval-")))
    loops = {name: training(side, [0]) for name, side in sides.items()}
    sampler = Sampler(threading.get_ident())
    pauses: list[float] = []
    gc_t0 = [0.0]

    def gc_cb(phase: str, info: dict) -> None:
        if phase == "start":
            gc_t0[0] = time.perf_counter()
        elif sampler.active.is_set():
            pauses.append(round(1000 * (time.perf_counter() - gc_t0[0]), 2))

    gc.callbacks.append(gc_cb)
    at = cfg["eval_every"]
    order = [args.first, "U" if args.first == "G" else "G"]
    result: dict = {"benchmark": "first_eval", "arm": args.arm, "eval_at": at, "first": args.first,
                    "contracts": os.environ.get("TRAINGUARD_CONTRACTS", "1") != "0",
                    "device": torch.cuda.get_device_name() if cuda else f"cpu x{os.cpu_count()}",
                    "torch": torch.__version__, "python": sys.version.split()[0]}
    for name in order:  # each copy to the step before its first evaluation, untimed
        for _ in range(at - 1):
            next(loops[name])
    if cuda:
        torch.cuda.synchronize()
    for name in order:
        steps_ms = []
        stats0 = torch.cuda.memory_stats() if cuda else {}
        for i in range(1 + args.after):
            pauses.clear()
            sampler.samples.clear()
            if i == 0:
                sampler.active.set()
            t0 = time.perf_counter()
            next(loops[name])
            if cuda:
                torch.cuda.synchronize()
            steps_ms.append(round(1000 * (time.perf_counter() - t0), 2))
            sampler.active.clear()
            if i == 0:
                names = {t.ident: t.name for t in threading.enumerate()}
                result[name] = {"sampled": sampler.report(names), "gc_pauses_ms": list(pauses)}
                if cuda:
                    stats1 = torch.cuda.memory_stats()
                    result[name]["allocator"] = {k: stats1.get(k, 0) - stats0.get(k, 0) for k in (
                        "num_alloc_retries", "num_device_alloc", "num_device_free", "num_sync_all_streams")}
        result[name]["steps_ms"] = steps_ms  # the evaluation's step first, then `after` steps
    sampler.stop = True
    sampler.active.set()
    G.guard.finish()
    line = json.dumps(result)
    print(line)
    if args.out:
        Path(args.out).write_text(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
