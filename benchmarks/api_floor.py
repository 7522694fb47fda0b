"""The floor under the probe's time on the training thread: the API's calls when they do (almost) nothing.

    python benchmarks/api_floor.py --arm launch          # the launch-bound GPU loop of fair_overhead.py
    python benchmarks/api_floor.py --arm launch-cpu      # its CPU stand-in

Issue 21 asks for at most 0.15 ms of the probe's time on the training thread per optimizer step of the
launch-bound loop (4 micro-batches of 1, the whole API). This measures, in one process, on the same loop
and with the same timers as `fair_overhead.py --timing on` (a timer around each call the loop makes, and
around each hook's function), four copies of the model side by side:

- U: the loop alone (no calls; its step times are the reference);
- N, null: every call of the API made (`phase`, `batches`, `step(loss, parts=..., weights=...)` each
  micro-batch, `due`, `eval`) and the probe's three hooks registered (a forward pre-hook on the model, the
  optimizer's pre- and post-hook), each returning at once: what entering the probe costs, whatever it does;
- K, keep: N plus the least any probe that keeps each micro-batch's values must do without reading the
  device: count, detach the loss and each part (holding the tensor itself would keep its autograd graph
  alive), append, and hand the window over at the optimizer step;
- G: `trainguard.watch`, the real probe.

Blocks of each copy run in an order that rotates, with a pause after each (the real probe's background work
ends there). Prints one JSON line: each copy's on-thread milliseconds per optimizer step (net of the
timers' own cost), by call, and its step time.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fair_overhead import ARMS, OnThread, Side, training, wrap_trainguard_hooks  # noqa: E402


class NullGuard:
    """The API, every call returning at once (the `due` count kept, so evaluations come as often)."""

    def __init__(self, model, opt, timer: OnThread) -> None:
        self.opt_steps = 0
        model.register_forward_pre_hook(timer.wrap("hooks", self.forward_pre))
        opt.register_step_pre_hook(timer.wrap("hooks", self.opt_pre))
        opt.register_step_post_hook(timer.wrap("hooks", self.opt_post))

    def phase(self, name: str):
        return contextlib.nullcontext()

    def batches(self, it):
        yield from it

    def step(self, loss, parts=None, weights=None) -> None:
        return None

    def due(self, name: str, every: int) -> bool:
        return self.opt_steps % every == 0

    def eval(self, **values) -> None:
        return None

    def forward_pre(self, module, args) -> None:
        return None

    def opt_pre(self, opt, args, kwargs) -> None:
        return None

    def opt_post(self, opt, args, kwargs) -> None:
        self.opt_steps += 1


class KeepGuard(NullGuard):
    """The null API plus what keeping each micro-batch's values costs at least: detached references."""

    def __init__(self, model, opt, timer: OnThread, accum: int) -> None:
        super().__init__(model, opt, timer)
        self.accum = accum
        self.micro = 0
        self.pending: list = []
        self.inflight: list = []

    def step(self, loss, parts=None, weights=None) -> None:
        self.micro += 1
        self.pending.append(("loss", loss.detach()))
        if parts:
            self.pending.append(("part:", {k: v.detach() for k, v in parts.items()}))

    def opt_post(self, opt, args, kwargs) -> None:
        self.opt_steps += 1
        self.inflight.append(self.pending)
        self.pending = []
        if len(self.inflight) > 64:
            del self.inflight[:32]  # (what a background thread would have read by now)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arm", choices=sorted(ARMS), default="launch-cpu")
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--block", type=int, default=8, help="optimizer steps per block")
    p.add_argument("--warmup", type=int, default=30, help="optimizer steps per copy before timing")
    p.add_argument("--gap", type=float, default=0.3)
    p.add_argument("--out")
    args = p.parse_args()

    import torch

    import trainguard
    from trainguard.demo.tinylm import corpus

    cfg = dict(ARMS[args.arm])
    cuda = cfg["device"] == "cuda"
    if not cuda:
        torch.set_num_threads(cfg["threads"])
    data = corpus(repeat=2000) % cfg["vocab"]
    sides = {name: Side(name, cfg, data) for name in "UNKG"}
    for name, side in sides.items():
        if name == "U":
            continue
        side.timer = OnThread()
        if name == "N":
            side.guard = NullGuard(side.model, side.opt, side.timer)
        elif name == "K":
            side.guard = KeepGuard(side.model, side.opt, side.timer, cfg["accum"])
        else:
            side.guard = trainguard.watch(side.model, side.opt, side.sched, total_steps=100_000,
                                          grad_accum=cfg["accum"], run_dir=tempfile.mkdtemp(prefix="tg-floor-"))
            wrap_trainguard_hooks(side.model, side.opt, side.timer)
    timer_wall, _ = OnThread().calibrate()
    loops = {name: training(side, [0]) for name, side in sides.items()}
    for loop in loops.values():
        for _ in range(args.warmup):
            next(loop)
    step_s: dict[str, list[float]] = {name: [] for name in sides}
    for side in sides.values():
        if side.timer is not None:
            side.timer.reset()
    orders = itertools.cycle(itertools.permutations("UNKG"))
    for _ in range(args.rounds):
        for name in next(orders):
            side = sides[name]
            if cuda:
                torch.cuda.synchronize()
            if side.timer is not None:
                side.timer.active = True
            t0 = time.perf_counter()
            for _ in range(args.block):
                next(loops[name])
            if cuda:
                torch.cuda.synchronize()
            step_s[name].append((time.perf_counter() - t0) / args.block)
            if side.timer is not None:
                side.timer.active = False
            time.sleep(args.gap)
    steps = args.rounds * args.block
    result: dict = {"benchmark": "api_floor", "arm": args.arm, "device": torch.cuda.get_device_name(0) if cuda else "cpu",
                    "torch": torch.__version__, "rounds": args.rounds, "block": args.block,
                    "timer_cost_us_per_call": round(1e6 * timer_wall, 3), "copies": {}}
    for name, side in sides.items():
        entry: dict = {"step_ms_median": round(1000 * statistics.median(step_s[name]), 3)}
        if side.timer is not None:
            spent, calls = side.timer.spent, side.timer.calls
            net = {k: (spent[k] - timer_wall * calls[k]) for k in spent}
            if "batches:loader" in net:  # the loader's own time inside `batches` is the loop's
                net["batches"] = net.get("batches", 0.0) + net.pop("batches:loader") + timer_wall * calls["batches:loader"]
            entry["on_thread_ms_per_step"] = round(1000 * sum(net.values()) / steps, 4)
            entry["by_call_ms_per_step"] = {k: round(1000 * v / steps, 4) for k, v in sorted(net.items())}
            entry["calls_per_step"] = {k: round(calls[k] / steps, 2) for k in sorted(calls) if k != "batches:loader"}
        result["copies"][name] = entry
    if sides["G"].guard is not None:
        sides["G"].guard.finish()
    line = json.dumps(result)
    print(line, flush=True)
    if args.out:
        Path(args.out).write_text(line + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
