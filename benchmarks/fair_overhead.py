"""The probe's overhead on a loop written the way people write them, against a control arm.

    python benchmarks/fair_overhead.py --arm cpu          # TinyLM on the CPU, 4 threads (needs >= 5 idle cores)
    python benchmarks/fair_overhead.py --arm gpu          # GPT-2-small shape, micro-batch 16, bf16 (GPU-bound)
    python benchmarks/fair_overhead.py --arm launch       # 4 layers x 256, micro-batch 1, bf16 (launch-bound)
    python benchmarks/fair_overhead.py --arm tiny         # a tiny CPU loop, 1 thread, many short steps (stalls)
    python benchmarks/fair_overhead.py --arm cpu --mode auto   # the automatic probe (`trainguard run`, no watch)
    TRAINGUARD_CONTRACTS=0 python benchmarks/fair_overhead.py --arm gpu   # without the contract checks
    TRAINGUARD_DEVICES=0 python benchmarks/fair_overhead.py --arm gpu     # without the device telemetry sampler
    python benchmarks/fair_overhead.py --suite gpu,gpu+nodevices --rounds 24 --out-dir DIR   # sampler on vs off
    python benchmarks/fair_overhead.py --suite cpu,gpu,launch,... --out-dir DIR   # several, one process each

One process trains three identical copies of the same model (same seed, same data stream):
- G, guarded: the whole API as a user calls it (`watch`, `phase("train")`, `batches(loader)`, `step(loss,
  parts={"nll": ..., "smooth": ...}, weights=...)` once per micro-batch, `grad_accum` micro-batches per optimizer step,
  `due("eval")` and, when due, `phase("eval")` with `eval(loss=...)`); with `--mode auto` the loop has no
  trainguard in it at all and runs under `trainguard run`, whose automatic probe takes G's optimizer
  (G steps first);
- U, unguarded: the same loop without trainguard (the eval loss read with float(), as a user prints it);
- C, control: a second unguarded copy. C against U is the harness's own noise: a G/U ratio is only
  meaningful beside it.

Each round runs one block of `--block` optimizer steps of each side, in an order that rotates through all
six orders of the three (so no side always follows another), with a `--gap` second pause after every
block: the probe's background work from a guarded block (its 0.2 s commit cycle, its rules pass) ends in
that pause instead of landing in the next side's block. On CUDA each block starts and ends with a
synchronize (block boundaries only). The figures:
- ratio G/U (and C/U) of the total time over all rounds, with a 95% bootstrap interval over rounds and a
  t-interval of the per-round ratios;
- the probe's time on the training thread per optimizer step: every trainguard call of the loop is timed
  where it is made, and every hook trainguard registered (optimizer, module, parameter, global) is
  re-wrapped through a timer, attributed to its module (guard vs contract checks);
- the CPU time of the probe's background thread per optimizer step (from the OS, by thread id);
- per-step times (host clock at each optimizer step): percentiles of each side and of the difference
  between a G step and its twin U step (same round, same position), p99.9 and max;
- the device telemetry sampler (devices/sampler.py: NVML every 5 s, the Xid event set, the kernel log) as it ran
  in G's process: on or off (TRAINGUARD_DEVICES=0, a suite's `+nodevices`), the GPU it found, its samples,
  events and CPU seconds;
- the garbage collector's pauses per side; on CUDA, synchronisations reported by
  `torch.cuda.set_sync_debug_mode("warn")` during training steps (evaluation reads its loss by design and
  is left out), per side.
Prints one JSON line (and writes it to --out).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import gc
import itertools
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

# Each arm's warm-up runs through its first evaluation (warmup = eval_every): the first evaluation of a
# process pays one-off costs outside the probe (its attention kernel's first use: ~90 ms on an H200, ~1 s
# for the first process on a fresh host, benchmarks/results/first_eval_h200.jsonl), and in the timed
# rounds the guarded copy always evaluates first (round 1 runs G, C, U), so it paid them alone.
ARMS: dict[str, dict] = {
    # TinyLM on the CPU, a step of tens of ms: the host is the bottleneck
    "cpu": dict(device="cpu", threads=4, vocab=256, dim=128, layers=2, heads=4, ctx=64, micro=16, accum=2,
                amp=None, block=6, rounds=150, warmup=25, eval_every=25, gap=0.3),
    # GPT-2 small's shape on a GPU, bf16: the device is the bottleneck, the host runs ahead
    "gpu": dict(device="cuda", vocab=50304, dim=768, layers=12, heads=12, ctx=512, micro=16, accum=2,
                amp="bf16", block=6, rounds=120, warmup=20, eval_every=20, gap=0.3),
    # a small model with micro-batch 1 on a GPU: the host's kernel launches are the bottleneck
    "launch": dict(device="cuda", vocab=50304, dim=256, layers=4, heads=4, ctx=256, micro=1, accum=4,
                   amp="bf16", block=6, rounds=150, warmup=25, eval_every=25, gap=0.3),
    # the launch-bound arm's loop on the CPU (micro-batch 1, 4 micro-batches a step, 1 thread): the probe's
    # per-micro-batch calls as often as there, for a machine without a GPU (no device copies, of course)
    "launch-cpu": dict(device="cpu", threads=1, vocab=256, dim=64, layers=4, heads=4, ctx=32, micro=1, accum=4,
                       amp=None, block=6, rounds=60, warmup=25, eval_every=25, gap=0.3),
    # a tiny CPU loop of sub-millisecond steps, many of them: where stalls of the probe would show
    "tiny": dict(device="cpu", threads=1, vocab=64, dim=32, layers=1, heads=2, ctx=16, micro=4, accum=1,
                 amp=None, block=1000, rounds=12, warmup=500, eval_every=500, gap=1.0),
}
SIDES = ("G", "U", "C")
WEIGHTS = {"nll": 0.9, "smooth": 0.1}
T975 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26, 10: 2.23, 12: 2.18,
        15: 2.13, 20: 2.09, 25: 2.06, 30: 2.04, 40: 2.02, 60: 2.00, 120: 1.98}


# -------------------------------------------------------------------------------------------------
# the statistics


def t975(df: int) -> float:
    keys = sorted(T975)
    for k in keys:
        if df <= k:
            return T975[k]
    return 1.96


def ratio_figures(base: list[float], test: list[float], draws: int = 5000) -> dict:
    """sum(test)/sum(base); its 95% bootstrap interval over rounds; the t-interval of per-round ratios."""
    rng = random.Random(0)
    pairs = list(zip(base, test))
    boots = []
    for _ in range(draws):
        pick = [pairs[rng.randrange(len(pairs))] for _ in pairs]
        boots.append(sum(t for _, t in pick) / sum(b for b, _ in pick))
    boots.sort()
    per = [t / b for b, t in pairs]
    mean = statistics.fmean(per)
    half = t975(len(per) - 1) * statistics.stdev(per) / math.sqrt(len(per)) if len(per) > 1 else float("nan")
    return {"ratio": round(sum(test) / sum(base), 4),
            "ci95_bootstrap": [round(boots[int(0.025 * draws)], 4), round(boots[int(0.975 * draws)], 4)],
            "mean_round_ratio": round(mean, 4), "ci95_t": [round(mean - half, 4), round(mean + half, 4)],
            "round_ratios": [round(x, 4) for x in per]}


def trimmed_mean(values: list[float], cut: float = 0.1) -> float:
    """The mean without the lowest and highest `cut` share (at least one each side from 10 values on)."""
    s = sorted(values)
    k = int(cut * len(s)) if len(s) >= 10 else 0
    k = max(k, 1) if len(s) >= 10 else k
    return statistics.fmean(s[k: len(s) - k])


def paired_figures(base: list[float], test: list[float], draws: int = 5000) -> dict:
    """Per-round paired ratios test/base (blocks of the same round, minutes apart at most), summarised
    robustly: their median and 10% trimmed mean, each with a 95% bootstrap interval over rounds. Robust
    to a round that holds a one-off event (the first evaluation's warm-up), which `ratio_figures`' sums
    are not; both are reported, and the one-off shows in `round_ratios`."""
    rng = random.Random(1)
    per = [t / b for b, t in zip(base, test)]
    n = len(per)
    meds, trims = [], []
    for _ in range(draws):
        pick = [per[rng.randrange(n)] for _ in range(n)]
        meds.append(statistics.median(pick))
        trims.append(trimmed_mean(pick))
    meds.sort()
    trims.sort()
    lo, hi = int(0.025 * draws), int(0.975 * draws)
    return {"median": round(statistics.median(per), 4), "median_ci95": [round(meds[lo], 4), round(meds[hi], 4)],
            "trimmed_mean": round(trimmed_mean(per), 4), "trimmed_ci95": [round(trims[lo], 4), round(trims[hi], 4)],
            "rounds": n}


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def step_figures(ms: list[float]) -> dict:
    return {"n": len(ms), "p50": round(pct(ms, 0.5), 3), "p99": round(pct(ms, 0.99), 3),
            "p99.9": round(pct(ms, 0.999), 3), "max": round(max(ms), 3)}


def twin_figures(test: list[list[float]], base: list[list[float]]) -> dict:
    """Each step of `test` against its twin (same round, same position) in `base`, in ms."""
    diff = [t - b for tb, bb in zip(test, base) for t, b in zip(tb, bb)]
    return {"p99.9_minus_p99.9_ms": round(pct([x for b in test for x in b], 0.999)
                                          - pct([x for b in base for x in b], 0.999), 3),
            "diff_p50_ms": round(pct(diff, 0.5), 3), "diff_p99_ms": round(pct(diff, 0.99), 3),
            "diff_p99.9_ms": round(pct(diff, 0.999), 3), "diff_max_ms": round(max(diff), 3),
            "steps_over_5ms_slower": sum(1 for d in diff if d > 5.0)}


# -------------------------------------------------------------------------------------------------
# timing the probe where it runs: on the training thread (its calls, its hooks) and its own thread


class OnThread:
    """Seconds spent in trainguard on the training thread, by where; counts only while `active`. Wall time
    (what the loop waits for: the probe's own work, and the interpreter lock when the probe's background
    thread holds it) and the training thread's CPU time (the probe's own work only)."""

    def __init__(self) -> None:
        self.active = False
        self.spent: dict[str, float] = {}
        self.cpu: dict[str, float] = {}
        self.calls: dict[str, int] = {}

    def add(self, where: str, dt: float, dcpu: float = 0.0) -> None:
        if self.active:
            self.spent[where] = self.spent.get(where, 0.0) + dt
            self.cpu[where] = self.cpu.get(where, 0.0) + dcpu
            self.calls[where] = self.calls.get(where, 0) + 1

    def call(self, where: str, fn, *a, **k):
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            return fn(*a, **k)
        finally:
            self.add(where, time.perf_counter() - t0, time.thread_time() - c0)

    def wrap(self, where: str, fn):
        @functools.wraps(fn)
        def timed(*a, **k):
            t0, c0 = time.perf_counter(), time.thread_time()
            try:
                return fn(*a, **k)
            finally:
                self.add(where, time.perf_counter() - t0, time.thread_time() - c0)
        return timed

    def reset(self) -> None:
        self.spent, self.cpu, self.calls = {}, {}, {}

    def calibrate(self, n: int = 20000) -> tuple[float, float]:
        """What timing one call costs by itself (wall, thread CPU seconds), inside the interval it measures:
        the median of 15 runs of `n` timed calls of a function that does nothing, through `wrap` (the hooks'
        path, one wrapper frame more than `call`). Subtracted per timed call for the net figures; a call of
        the probe that did nothing would still cost its own call, which is not subtracted."""
        def noop(*a, **k):
            return None

        timed, was = self.wrap("calibration", noop), self.active
        walls, cpus = [], []
        for _ in range(15):
            self.active, self.spent, self.cpu, self.calls = True, {}, {}, {}
            for _ in range(n):
                timed(None, None, None)
            walls.append(self.spent["calibration"] / n)
            cpus.append(self.cpu["calibration"] / n)
        self.active = was
        self.reset()
        return statistics.median(walls), statistics.median(cpus)


def _owner(fn) -> str:
    fn = getattr(fn, "__func__", fn)
    mod = getattr(fn, "__module__", "") or ""
    if not mod.startswith("trainguard"):
        return ""
    return "hooks:contracts" if "contracts" in mod else "hooks:" + mod.rsplit(".", 1)[-1]


def wrap_trainguard_hooks(model, opt, timer: OnThread) -> int:
    """Re-wraps every hook a trainguard module registered (optimizer, global optimizer, each module,
    each parameter) through `timer`; returns how many. Independent of the probe's internals: it reads
    torch's own hook dictionaries."""

    n = 0
    for d in _hook_dicts(model, opt):
        for key, fn in list(d.items()):
            where = _owner(fn)
            if where and not getattr(fn, "_tg_timed", False):
                # A hook that registers a one-shot hook of its own object for the forward under way (the
                # contract checks' post-hook on sampled forwards) registers it from an attribute: timed there,
                # since it comes and goes inside a block
                owner = getattr(fn, "__self__", None)
                once = getattr(owner, "_post_once", None)
                if once is not None and not getattr(once, "_tg_timed", False):
                    owner._post_once = timer.wrap(where, once)
                    owner._post_once._tg_timed = True
                w = timer.wrap(where, fn)
                w._tg_timed = True
                d[key] = w
                n += 1
    return n


def _hook_dicts(model, opt) -> list:
    import torch.optim.optimizer as optimizer_module

    dicts = [getattr(opt, "_optimizer_step_pre_hooks", None), getattr(opt, "_optimizer_step_post_hooks", None),
             getattr(optimizer_module, "_global_optimizer_pre_hooks", None),
             getattr(optimizer_module, "_global_optimizer_post_hooks", None)]
    for m in model.modules():
        dicts += [m._forward_pre_hooks, m._forward_hooks, m._backward_hooks, m._backward_pre_hooks]
    for p in model.parameters():
        dicts += [getattr(p, "_backward_hooks", None), getattr(p, "_post_accumulate_grad_hooks", None)]
    return [d for d in dicts if d is not None]


class HookSwitch:
    """With one model for all arms (`--layout same`): trainguard's hooks are taken out of torch's hook
    dictionaries for the unguarded arms' blocks and put back for the guarded arm's, so U and C run the
    very same model, optimizer and memory without the probe (its idle background thread aside)."""

    def __init__(self, model, opt) -> None:
        self.model, self.opt = model, opt
        self.stashed: list = []  # (dict, key, hook)
        self.most = 0  # the most hooks taken out at once (0 would mean U and C ran with the probe)

    def off(self) -> None:
        for d in _hook_dicts(self.model, self.opt):
            for key, fn in list(d.items()):
                if _owner(fn):
                    self.stashed.append((d, key, d.pop(key)))
        self.most = max(self.most, len(self.stashed))

    def on(self) -> None:
        for d, key, fn in self.stashed:
            d[key] = fn
        self.stashed = []


def pin_threads(spec: str | None) -> list[int] | None:
    """`--pin 0-7`: this process (and the torch threads it starts) on those cores only."""
    if not spec:
        return None
    cpus: set[int] = set()
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    os.sched_setaffinity(0, cpus)
    return sorted(cpus)


def probe_thread_cpu() -> float:
    """CPU seconds (user + system) of the probe's background thread(s), from the OS: each thread's own CPU
    clock (nanoseconds; psutil's per-thread times count 10 ms ticks, coarser than a short run's total)."""
    threads = [t for t in threading.enumerate() if t.name.startswith("trainguard")]
    try:
        return sum(time.clock_gettime(time.pthread_getcpuclockid(t.ident)) for t in threads if t.ident)
    except (AttributeError, OSError):  # no per-thread clocks here (or a thread just ended)
        import psutil

        ids = {t.native_id for t in threads}
        return sum(th.user_time + th.system_time for th in psutil.Process().threads() if th.id in ids)


def background_stretches(reset: bool = False) -> dict | None:
    """The probe's background thread's stretches of work between two pauses (probe/pacing.py), in CPU ms:
    how long it may have kept the interpreter lock from the training thread in one go. `reset` starts
    the count (before the timed rounds)."""
    try:
        from trainguard.probe.pacing import STRETCHES
    except ImportError:  # a trainguard without pacing figures
        return None
    if reset:
        STRETCHES.__init__()
        return None
    return {"count": STRETCHES.count, "longest_ms": round(1000 * STRETCHES.longest, 3),
            "over_1ms": STRETCHES.over_1ms}


class GcClock:
    """The garbage collector's pauses, attributed to the side whose block is running."""

    def __init__(self) -> None:
        self.side: str | None = None
        self.t0 = 0.0
        self.total: dict[str, float] = {}
        self.worst: dict[str, float] = {}
        self.count: dict[str, int] = {}
        gc.callbacks.append(self.cb)

    def cb(self, phase: str, info: dict) -> None:
        if phase == "start":
            self.t0 = time.perf_counter()
        elif self.side is not None:
            dt = time.perf_counter() - self.t0
            # a collection on another thread (the probe's) stops the training thread too
            s = self.side if threading.current_thread() is threading.main_thread() else self.side + ":other-thread"
            self.total[s] = self.total.get(s, 0.0) + dt
            self.worst[s] = max(self.worst.get(s, 0.0), dt)
            self.count[s] = self.count.get(s, 0) + 1


class Profiles:
    """`--profile`: cProfile of the training thread during G's blocks and of the probe's background
    thread (its loop, from the start), summarised as trainguard's functions by cumulative time per
    optimizer step. A diagnosis of where the time goes, not a figure: profiling slows Python ~2x."""

    def __init__(self, which: str | None) -> None:
        import cProfile

        self.main = cProfile.Profile() if which == "main" else None
        self.which = which

    def summary(self, steps: int) -> dict | None:
        if self.main is not None:
            return {"main": _top(self.main, steps)}
        if self.which == "background" and background_profile is not None:
            background_profile.disable()
            return {"background": _top(background_profile, steps)}
        return None


background_profile = None


def profile_background_thread() -> None:
    """Wraps the probe's background loop in a profiler before any guard starts (`--profile`)."""
    import cProfile

    from trainguard.probe import flusher

    loop = flusher.Flusher._loop

    def profiled(self) -> None:
        global background_profile
        background_profile = cProfile.Profile()
        background_profile.enable()
        try:
            loop(self)
        finally:
            background_profile.disable()

    flusher.Flusher._loop = profiled


def _top(prof, steps: int, n: int = 40) -> list:
    """The heaviest functions by cumulative time (trainguard's, and what they call directly), in ms per
    optimizer step: [function, calls per step, own ms, cumulative ms]."""
    import pstats

    st = pstats.Stats(prof)
    rows = []
    for (fname, line, func), (_cc, nc, tt, ct, callers) in st.stats.items():
        ours = "trainguard" in fname
        called_by_us = any("trainguard" in c[0] for c in callers)
        if not (ours or called_by_us) or func in ("<genexpr>", "<listcomp>", "<lambda>") and not ours:
            continue
        where = f"{fname.rsplit('/src/', 1)[-1]}:{line}({func})" if ours else f"{func} <- trainguard"
        rows.append([where, round(nc / steps, 2), round(1000 * tt / steps, 4), round(1000 * ct / steps, 4)])
    return sorted(rows, key=lambda r: -r[3])[:n]


# -------------------------------------------------------------------------------------------------
# the loop


class Side:
    def __init__(self, name: str, cfg: dict, data, seed: int = 0) -> None:
        import torch

        from trainguard.demo.tinylm import TinyLM, cosine_with_warmup

        self.name, self.cfg = name, cfg
        torch.manual_seed(seed)
        self.model = TinyLM(vocab=cfg["vocab"], dim=cfg["dim"], layers=cfg["layers"], heads=cfg["heads"],
                            ctx=cfg["ctx"]).to(cfg["device"])
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=3e-4, weight_decay=0.1,
                                     fused=cfg["device"] == "cuda")
        self.sched = cosine_with_warmup(self.opt, warmup=10, total=100_000)
        self.data = data
        self.gen = torch.Generator().manual_seed(1)
        self.guard = None
        self.timer: OnThread | None = None
        self.step_ms: list[list[float]] = []
        self.block_s: list[float] = []
        self.syncs = 0
        self.thread_cpu_s = 0.0  # the training thread's CPU time in this arm's blocks
        self.process_cpu_s = 0.0  # the whole process's (torch's worker threads, the probe's thread)

    def get_batch(self, split_gen):
        """nanoGPT's get_batch: random windows of a token array, pinned and copied without blocking."""
        import torch

        cfg, data = self.cfg, self.data
        ix = torch.randint(len(data) - cfg["ctx"] - 1, (cfg["micro"],), generator=split_gen)
        x = torch.stack([data[i: i + cfg["ctx"]] for i in ix])
        y = torch.stack([data[i + 1: i + 1 + cfg["ctx"]] for i in ix])
        if cfg["device"] == "cuda":
            return (x.pin_memory().to("cuda", non_blocking=True), y.pin_memory().to("cuda", non_blocking=True))
        return x, y

    def loader(self):
        while True:
            yield self.get_batch(self.gen)


def training(side: Side, sync_mode: list):
    """The loop, as a generator that yields after each optimizer step. With a guard: the whole API."""
    import torch
    import torch.nn.functional as F

    cfg, model, opt, sched, g, tm = side.cfg, side.model, side.opt, side.sched, side.guard, side.timer
    accum, cuda = cfg["accum"], cfg["device"] == "cuda"
    amp = (torch.autocast("cuda", dtype=torch.bfloat16) if cfg["amp"] == "bf16" else contextlib.nullcontext())
    eval_gen = torch.Generator().manual_seed(2)

    @contextlib.contextmanager
    def phase(name: str):
        if g is None:
            yield
            return
        cm = g.phase(name)
        if tm is None:  # --timing off: the calls as a user makes them
            with cm:
                yield
            return
        tm.call("phase", cm.__enter__)
        try:
            yield
        finally:
            tm.call("phase", cm.__exit__, None, None, None)

    def timed_source():  # the loader's own time, to take out of guard.batches' time
        it = side.loader()
        while True:
            t0, c0 = time.perf_counter(), time.thread_time()
            item = next(it)
            tm.add("batches:loader", -(time.perf_counter() - t0), -(time.thread_time() - c0))
            yield item

    def batches():
        if g is None:
            yield from side.loader()
            return
        if tm is None:
            yield from g.batches(side.loader())
            return
        it = g.batches(timed_source())
        while True:
            t0, c0 = time.perf_counter(), time.thread_time()
            item = next(it)
            tm.add("batches", time.perf_counter() - t0, time.thread_time() - c0)
            yield item

    def evaluate():
        model.eval()
        with torch.no_grad(), amp:
            losses = []
            for _ in range(2):
                x, y = side.get_batch(eval_gen)
                logits = model(x)
                losses.append(F.cross_entropy(logits.flatten(0, 1), y.flatten()))
        model.train()
        return torch.stack(losses).mean()

    step = 0
    with phase("train"):
        for micro, (x, y) in enumerate(batches(), start=1):
            with amp:
                logits = model(x)
                # label smoothing written out as two parts: the target's NLL and the uniform term
                logp = F.log_softmax(logits.float(), dim=-1)
                nll = F.nll_loss(logp.flatten(0, 1), y.flatten())
                smooth = -logp.mean()
            loss = 0.9 * nll + 0.1 * smooth
            (loss / accum).backward()
            if g is not None:
                if tm is None:
                    g.step(loss, parts={"nll": nll, "smooth": smooth}, weights=WEIGHTS)
                else:
                    tm.call("step", g.step, loss, parts={"nll": nll, "smooth": smooth}, weights=WEIGHTS)
            if micro % accum:
                continue
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            if g is None:
                due = step % cfg["eval_every"] == 0
            else:
                due = g.due("eval", cfg["eval_every"]) if tm is None else tm.call("due", g.due, "eval", cfg["eval_every"])
            if due:
                if cuda:
                    torch.cuda.set_sync_debug_mode(0)  # the eval loss is read on purpose
                with phase("eval"):
                    val = evaluate()
                    if g is not None and tm is None:
                        g.eval(loss=val)
                    elif g is not None:
                        tm.call("eval", g.eval, loss=val)
                    else:
                        float(val)
                if cuda:
                    torch.cuda.set_sync_debug_mode(sync_mode[0])
            yield


def run_block(side: Side, loop, n: int, cuda: bool, gcc: GcClock, prof=None) -> None:
    import torch

    if cuda:
        torch.cuda.synchronize()
    gcc.side = side.name
    if side.timer is not None:
        side.timer.active = True
    times = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if prof is not None:
            prof.enable()
        cpu0, proc0 = time.thread_time(), time.process_time()
        t0 = time.perf_counter()
        last = t0
        for _ in range(n):
            next(loop)
            now = time.perf_counter()
            times.append(1000 * (now - last))
            last = now
        if cuda:
            torch.cuda.synchronize()
        total = time.perf_counter() - t0
        side.thread_cpu_s += time.thread_time() - cpu0
        side.process_cpu_s += time.process_time() - proc0
        if prof is not None:
            prof.disable()
    if side.timer is not None:
        side.timer.active = False
    gcc.side = None
    side.syncs += sum(1 for w in caught if "synchroniz" in str(w.message))
    side.step_ms.append(times)
    side.block_s.append(total)


def child(args: argparse.Namespace) -> dict:
    import torch

    cfg = dict(ARMS[args.arm])
    for key in ("block", "rounds", "warmup", "gap", "threads"):
        if getattr(args, key) is not None:
            cfg[key] = getattr(args, key)
    cuda = cfg["device"] == "cuda"
    pinned = pin_threads(args.pin)
    if not cuda:
        torch.set_num_threads(cfg["threads"])
    # a learnable text (byte tokens), so the healthy loop's loss falls as a real run's does
    from trainguard.demo.tinylm import corpus

    data = corpus(repeat=2000) % cfg["vocab"]
    if args.layout == "copies":
        sides = {name: Side(name, cfg, data) for name in SIDES}
    else:
        # one model, optimizer and data stream for all three arms: no copy runs on memory laid out
        # differently from another's (three copies differed by a few percent, steadily, on these VMs)
        sides = {"G": Side("G", cfg, data)}
        for name in SIDES[1:]:
            arm = copy.copy(sides["G"])
            arm.name, arm.step_ms, arm.block_s, arm.syncs = name, [], [], 0
            arm.thread_cpu_s = arm.process_cpu_s = 0.0
            sides[name] = arm
    G = sides["G"]
    timer = OnThread()
    timer_wall, timer_cpu = timer.calibrate()
    timing = args.timing == "on"
    G.timer = timer if timing else None
    guard = None
    run_dir = Path(args.run_dir or tempfile.mkdtemp(prefix="tg-fair-"))
    if args.mode == "watch":
        import trainguard

        guard = trainguard.watch(G.model, G.opt, G.sched, total_steps=100_000, grad_accum=cfg["accum"],
                                 run_dir=run_dir)
        G.guard = guard
    sync_mode = ["warn" if cuda else 0]
    loops = {name: training(side, sync_mode) for name, side in sides.items()}
    # warm-up, G first: with --mode auto its first optimizer step is the one the automatic probe takes
    for _ in range(cfg["warmup"]):
        next(loops["G"])
    if args.mode == "auto":
        from trainguard.probe import auto

        guard = auto._state["guard"]
        if guard is None or guard.optimizer is not G.opt:
            raise SystemExit("the automatic probe did not take G's optimizer (run this under `trainguard run`)")
    n_hooks = wrap_trainguard_hooks(G.model, G.opt, timer) if timing else 0
    switch = HookSwitch(G.model, G.opt) if args.layout == "same" else None
    if switch is not None:
        switch.off()  # from here on the probe's hooks are in place only for G's blocks
    for name in SIDES[1:]:
        for _ in range(cfg["warmup"]):
            next(loops[name])
    gcc = GcClock()
    profiles = Profiles(args.profile)
    if cuda:
        torch.cuda.set_sync_debug_mode(sync_mode[0])
    timer.reset()
    cpu0 = probe_thread_cpu()
    background_stretches(reset=True)
    bg_in_blocks = 0.0  # the background thread's CPU during G's blocks; the rest fell in pauses or other blocks
    orders = list(itertools.permutations(SIDES))
    t_start = time.time()
    for r in range(cfg["rounds"]):
        for name in orders[r % len(orders)]:
            if name == "G" and switch is not None:
                switch.on()
                if timing:
                    n_hooks += wrap_trainguard_hooks(G.model, G.opt, timer)  # hooks the probe added since
            c0 = probe_thread_cpu() if name == "G" else 0.0
            run_block(sides[name], loops[name], cfg["block"], cuda, gcc, profiles.main if name == "G" else None)
            if name == "G":
                bg_in_blocks += probe_thread_cpu() - c0
                if switch is not None:
                    switch.off()
            time.sleep(cfg["gap"])
    wall = time.time() - t_start
    if switch is not None:
        switch.on()
    if cuda:
        torch.cuda.set_sync_debug_mode(0)
    bg_cpu = probe_thread_cpu() - cpu0
    stretches = background_stretches()
    steps = cfg["rounds"] * cfg["block"]
    sampler_obj = getattr(guard, "_devices", None)  # (taken before finish: finish stops it and lets it go)
    if guard is not None and args.mode == "watch":
        guard.finish()
    sampler = device_sampler(sampler_obj, wall)  # (its threads add their CPU time as they end, at finish)
    rows = None
    with contextlib.suppress(Exception):
        import sqlite3

        with sqlite3.connect(run_dir / "run.db") as db:
            rows = db.execute("select count(*) from steps").fetchone()[0]
    log = run_dir / "guard.log"
    on_thread = {k: round(1000 * v / steps, 4) for k, v in sorted(timer.spent.items())}
    on_thread_total = sum(timer.spent.values())  # "batches:loader" is negative: the loader's own time
    # "batches:loader" is timed inside "batches" (twice the clocks, once its negative share): count both
    probe_calls = sum(timer.calls.values())
    U, C = sides["U"], sides["C"]
    flat = {n: [x for b in s.step_ms for x in b] for n, s in sides.items()}
    return {
        "benchmark": "fair_overhead", "arm": args.arm, "mode": args.mode, "timing": args.timing,
        "contracts": os.environ.get("TRAINGUARD_CONTRACTS", "1") != "0",
        "device": torch.cuda.get_device_name() if cuda else f"cpu x{os.cpu_count()}",
        "torch": torch.__version__, "python": sys.version.split()[0],
        "threads": torch.get_num_threads(), "config": cfg, "wall_s": round(wall, 1),
        "step_ms": {n: round(1000 * sum(s.block_s) / steps, 3) for n, s in sides.items()},
        # CPU per optimizer step, inside each arm's blocks: where G's extra wall time is CPU work of the
        # training thread (hooks, their calls from C++), or of other threads, or waiting
        "thread_cpu_ms_per_step": {n: round(1000 * s.thread_cpu_s / steps, 3) for n, s in sides.items()},
        "process_cpu_ms_per_step": {n: round(1000 * s.process_cpu_s / steps, 3) for n, s in sides.items()},
        "layout": args.layout, "pinned_cpus": pinned, "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "hooks_switched_off": switch.most if switch else None,
        "guarded_vs_unguarded": ratio_figures(U.block_s, G.block_s),
        "control_vs_unguarded": ratio_figures(U.block_s, C.block_s),
        "guarded_vs_unguarded_paired": paired_figures(U.block_s, G.block_s),
        "control_vs_unguarded_paired": paired_figures(U.block_s, C.block_s),
        # the background thread's CPU that did not fall inside a G block (its work after a block ends, in
        # the pause): charged to G here as if all of it had stopped the training thread, an upper bound
        "guarded_vs_unguarded_bound": round((sum(G.block_s) + max(0.0, bg_cpu - bg_in_blocks)) / sum(U.block_s), 4),
        "probe_thread_cpu_outside_blocks_ms_per_step": round(1000 * max(0.0, bg_cpu - bg_in_blocks) / steps, 4),
        "on_thread_ms_per_step": round(1000 * on_thread_total / steps, 4),
        "on_thread_breakdown_ms_per_step": on_thread,
        # the same calls' CPU time on the training thread: the probe's own work, without the waits for the
        # interpreter lock (the background thread's share, in probe_thread_cpu_ms_per_step)
        "on_thread_cpu_ms_per_step": round(1000 * sum(timer.cpu.values()) / steps, 4),
        "on_thread_cpu_breakdown_ms_per_step": {k: round(1000 * v / steps, 4) for k, v in sorted(timer.cpu.items())},
        "on_thread_calls": dict(sorted(timer.calls.items())),
        # the same less what timing each call costs by itself (`OnThread.calibrate`, times the calls timed;
        # "batches:loader" is a correction, not a call)
        "timer_cost_us_per_call": {"wall": round(1e6 * timer_wall, 3), "cpu": round(1e6 * timer_cpu, 3)},
        "on_thread_net_ms_per_step": round(1000 * (on_thread_total - timer_wall * probe_calls) / steps, 4),
        "on_thread_cpu_net_ms_per_step": round(1000 * (sum(timer.cpu.values()) - timer_cpu * probe_calls) / steps, 4),
        "hooks_timed": n_hooks,
        "probe_thread_cpu_ms_per_step": round(1000 * bg_cpu / steps, 4),
        "probe_thread_cpu_ms_per_s": round(1000 * bg_cpu / wall, 4),  # per second of the timed rounds
        # ... and per second of G's blocks (while the guarded loop trains)
        "probe_thread_cpu_in_blocks_ms_per_s": round(1000 * bg_in_blocks / sum(G.block_s), 4),
        # its longest stretch of work between two pauses (the interpreter lock held from the loop in one go)
        "probe_thread_stretches": stretches,
        "per_step_ms": {n: step_figures(v) for n, v in flat.items()},
        "twins_guarded_vs_unguarded": twin_figures(G.step_ms, U.step_ms),
        "twins_control_vs_unguarded": twin_figures(C.step_ms, U.step_ms),
        # where the worst guarded steps fell: (round, position in the block, ms, the twin U step's ms)
        "slowest_guarded_steps": sorted(
            ([r, i, round(ms, 2), round(U.step_ms[r][i], 2)] for r, b in enumerate(G.step_ms) for i, ms in enumerate(b)),
            key=lambda x: -x[2])[:6],
        "gc_ms": {n: {"total": round(1000 * gcc.total.get(n, 0.0), 2), "worst": round(1000 * gcc.worst.get(n, 0.0), 2),
                      "count": gcc.count.get(n, 0)} for n in sorted(gcc.count)},
        "sync_warnings": {n: s.syncs for n, s in sides.items()} if cuda else None,
        "device_sampler": sampler,
        "rows_stored": rows,
        "guard_errors": log.read_text()[-1500:] if log.exists() else "",
        "profile": profiles.summary(steps),
    }


def device_sampler(s: object, wall: float) -> dict:
    """What the probe's device telemetry did in this process: on (TRAINGUARD_DEVICES unset, nvidia-ml-py
    importable) or off, the GPU it found, its samples and events, its threads' CPU seconds (whole process life).

    Its threads run beside all three arms' blocks (they are not switched per block as the hooks are): G/U in
    one process is the probe's per-step work without it. The sampler's own cost is its CPU here, and U's step
    time with it (a `gpu` arm) against without it (`gpu+nodevices`), each beside its process's C/U noise."""
    from trainguard.devices import sampler as devices

    gpu = getattr(s, "gpu", None)
    cpu_s = getattr(s, "cpu_s", 0.0)
    return {"enabled": devices.enabled(), "running": s is not None,
            "gpu_pci": getattr(gpu, "pci", None), "samples": getattr(s, "samples", 0),
            "events": getattr(s, "events", 0), "cpu_s": round(cpu_s, 4),
            "cpu_ms_per_s_of_rounds": round(1000 * cpu_s / wall, 4) if wall > 0 else None,
            "threads": [t.name for t in getattr(s, "_threads", [])]}


# -------------------------------------------------------------------------------------------------
# several arms, one fresh process each


def suite(args: argparse.Namespace) -> int:
    out_dir = Path(args.out_dir or ".")
    out_dir.mkdir(parents=True, exist_ok=True)
    env0 = {k: v for k, v in os.environ.items() if not k.startswith("TRAINGUARD_")}
    rc = 0
    for spec in args.suite.split(","):
        # NAME[+auto][+nocontracts][+nodevices]: e.g. cpu, gpu+nocontracts, launch+auto, gpu+nodevices
        arm, *flags = spec.split("+")
        env = dict(env0)
        if "nocontracts" in flags:
            env["TRAINGUARD_CONTRACTS"] = "0"
        if "nodevices" in flags:
            env["TRAINGUARD_DEVICES"] = "0"  # the device telemetry sampler off (devices/sampler.py)
        out = out_dir / f"fair_{spec.replace('+', '_')}.json"
        cmd = [sys.executable, __file__, "--arm", arm, "--out", str(out)]
        for key in ("block", "rounds", "warmup", "gap", "threads", "layout", "pin", "timing"):
            if getattr(args, key) is not None:
                cmd += [f"--{key}", str(getattr(args, key))]
        if args.profile:
            cmd += ["--profile", args.profile]
        if "auto" in flags:
            run_dir = tempfile.mkdtemp(prefix="tg-fair-auto-")
            cmd = [sys.executable, "-m", "trainguard", "run", "--run-dir", run_dir, "--",
                   *cmd, "--mode", "auto", "--run-dir", run_dir]
        t0 = time.time()
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        if p.returncode != 0 or not out.exists():
            rc = 1
            print(json.dumps({"arm": spec, "rc": p.returncode, "stderr": p.stderr[-3000:],
                              "stdout": p.stdout[-1500:]}), flush=True)
            continue
        got = json.loads(out.read_text())
        g, c = got["guarded_vs_unguarded"], got["control_vs_unguarded"]
        gp, cp = got["guarded_vs_unguarded_paired"], got["control_vs_unguarded_paired"]
        print(json.dumps({"arm": spec, "s": round(time.time() - t0), "step_ms": got["step_ms"],
                          "G/U": [g["ratio"], g["ci95_bootstrap"], g["ci95_t"]],
                          "C/U": [c["ratio"], c["ci95_bootstrap"], c["ci95_t"]],
                          "G/U trimmed": [gp["trimmed_mean"], gp["trimmed_ci95"]],
                          "C/U trimmed": [cp["trimmed_mean"], cp["trimmed_ci95"]],
                          "G/U bound": got["guarded_vs_unguarded_bound"],
                          "on_thread_ms": got["on_thread_ms_per_step"], "on_thread_cpu_ms": got["on_thread_cpu_ms_per_step"],
                          "bg_cpu_ms": got["probe_thread_cpu_ms_per_step"],
                          "bg_stretch_ms": (got.get("probe_thread_stretches") or {}).get("longest_ms"),
                          "twin_p999_ms": got["twins_guarded_vs_unguarded"]["diff_p99.9_ms"],
                          "control_twin_p999_ms": got["twins_control_vs_unguarded"]["diff_p99.9_ms"],
                          "syncs": got["sync_warnings"], "rows": got["rows_stored"],
                          "device_sampler": got.get("device_sampler"),
                          "errors": bool(got["guard_errors"])}), flush=True)
    return rc


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arm", choices=sorted(ARMS), default="cpu")
    p.add_argument("--mode", choices=["watch", "auto"], default="watch",
                   help="auto: no trainguard in the loop; run under `trainguard run` (or use --suite ARM+auto)")
    p.add_argument("--suite", help="comma-separated arms, each in a fresh process: ARM[+auto][+nocontracts]"
                   "[+nodevices] (+nodevices: TRAINGUARD_DEVICES=0, the device telemetry sampler off)")
    p.add_argument("--out-dir", help="with --suite: where each arm's JSON goes")
    p.add_argument("--block", type=int, help="optimizer steps per block (default: the arm's)")
    p.add_argument("--rounds", type=int, help="rounds of three blocks (default: the arm's)")
    p.add_argument("--warmup", type=int, help="untimed optimizer steps per side first")
    p.add_argument("--gap", type=float, help="seconds of pause after each block")
    p.add_argument("--threads", type=int, help="torch CPU threads (CPU arms)")
    p.add_argument("--layout", choices=["same", "copies"], default="same",
                   help="same: one model for the three arms, the probe's hooks switched per block (default); "
                        "copies: three copies of the model")
    p.add_argument("--pin", help="cores to run on, e.g. 0-7 (sched_setaffinity; default: all)")
    p.add_argument("--run-dir", help="the guarded side's run folder (default: a temporary one)")
    p.add_argument("--out", help="also write the JSON result here")
    p.add_argument("--timing", choices=["on", "off"], default="on",
                   help="off: G's calls and hooks are not timed (no on-thread figures): the timers' own cost, "
                        "a Python frame or two around each call, is then not in G's blocks")
    p.add_argument("--profile", choices=["main", "background"],
                   help="cProfile the training thread in G's blocks, or the probe's background thread (one at a "
                        "time: Python 3.12's profilers are process-wide); slows what it profiles: a diagnosis")
    args = p.parse_args()
    if args.suite:
        return suite(args)
    if ARMS[args.arm]["device"] == "cpu":
        # torch's OpenMP workers spin between parallel regions instead of sleeping: a sleeping team's
        # wake-up jitter was most of the CPU arm's block-to-block noise. Read when torch loads, so here.
        os.environ.setdefault("OMP_WAIT_POLICY", "ACTIVE")
    if args.profile == "background":
        profile_background_thread()
    result = child(args)
    line = json.dumps(result)
    print(line)
    if args.out:
        Path(args.out).write_text(line + "\n")
    return 1 if result["guard_errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
