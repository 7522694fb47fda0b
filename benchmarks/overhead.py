"""The probe's overhead: the same training loop guarded and unguarded, in one process, as a ratio.

    python benchmarks/overhead.py                  # CPU: a small transformer LM, tens of ms a step
    python benchmarks/overhead.py --device cuda    # GPU: a GPT-2-small-shaped step in bf16, with
                                                   # torch.cuda.set_sync_debug_mode("error") on: any
                                                   # host-device sync in the loop or the probe raises
    python benchmarks/overhead.py --device cuda --amp fp16   # fp16 + GradScaler (the probe watches the
                                                   # loss scale); GradScaler.step itself syncs, so the
                                                   # mode is "warn" and no warning may come from trainguard

Two identical models and optimizers are built from the same seed; one is watched. Blocks of steps
alternate between them (A B A B ...), so drift in the machine's speed falls on both alike; the figure is
the ratio of the total guarded time to the total unguarded time. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

import trainguard
from trainguard.demo.tinylm import TinyLM, batch, corpus, cosine_with_warmup


def build(device: str, dim: int, layers: int, heads: int, ctx: int, seed: int = 0):
    torch.manual_seed(seed)
    model = TinyLM(vocab=256 if device == "cpu" else 50304, dim=dim, layers=layers, heads=heads, ctx=ctx).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    sched = cosine_with_warmup(opt, warmup=10, total=10_000)
    return model, opt, sched


def make_step(model, opt, sched, data, args, gen, guard=None, scaler=None):
    vocab = model.head.out_features
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.amp)
    amp = torch.autocast(args.device, dtype=dtype) if dtype is not None else _null()

    def step() -> None:
        for _ in range(args.grad_accum):
            if args.device == "cpu":
                x, y = batch(data, args.batch_size, args.ctx, gen)
            else:
                x = torch.randint(vocab, (args.batch_size, args.ctx), device=args.device)
                y = torch.roll(x, -1, dims=1)
            with amp:
                logits = model(x)
                loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), y.flatten())
            if scaler is not None:
                scaler.scale(loss / args.grad_accum).backward()
            else:
                (loss / args.grad_accum).backward()
            if guard is not None:
                guard.step(loss, parts={"ce": loss})
        if scaler is not None:
            scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if scaler is not None:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)

    return step


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def _rules_cpu(guard) -> float:
    """CPU seconds the probe's thread spent in the health rules (a probe running alone runs them)."""
    rules = guard.probe._ending.rules
    return rules.cpu if rules is not None else 0.0


def _thread_cpu(guard) -> float:
    """CPU seconds used so far by the probe's background thread (user + system), from the OS."""
    import psutil

    native = getattr(getattr(guard.probe.drainer, "_thread", None), "native_id", None)
    for th in psutil.Process().threads():
        if th.id == native:
            return th.user_time + th.system_time
    return 0.0


def _time_contracts(guard, model, opt) -> dict[str, float]:
    """Re-registers the contract checks' hooks (probe/contracts.py) through a timer of their own: their
    share of the hot path, measured directly. TRAINGUARD_CONTRACTS=0 runs the benchmark without them."""
    spent = {"all": 0.0, "in_step": 0.0}
    c = guard.contracts
    if c is None:
        return spent

    def timed(fn, also: str | None = None):
        def wrapper(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                dt = time.perf_counter() - t0
                spent["all"] += dt
                if also:
                    spent[also] += dt
        return wrapper

    for handle in c.handles:
        handle.remove()
    c.opt_pre = timed(c.opt_pre)  # called from the guard's own optimizer hooks (probe/opthooks.py)
    c.opt_post = timed(c.opt_post)
    if c.module is not None:
        model.register_forward_pre_hook(timed(c._forward_pre), with_kwargs=True)
        c._post_once = timed(c._post_once)  # the post-hook, put on by the pre-hook for a forward that needs it
    for w in c.grad_watch:  # the gradient watch's tensor hook (put in place and taken out by the checks)
        w.fn = timed(w.fn)
        if w.armed:
            w.hooks[w.key] = w.fn
    c.on_loss = timed(c.on_loss, also="in_step")
    return spent


def _bootstrap_ci(plain: list[float], guarded: list[float], draws: int = 5000) -> list[float]:
    """95% interval of the overhead (%) from resampling whole A/B rounds: how far the noise between
    rounds leaves the figure uncertain."""
    import random

    rng = random.Random(0)
    pairs = list(zip(plain, guarded))
    figures = []
    for _ in range(draws):
        pick = [pairs[rng.randrange(len(pairs))] for _ in pairs]
        figures.append(100 * (sum(g for _, g in pick) / sum(u for u, _ in pick) - 1))
    figures.sort()
    return [round(figures[int(0.025 * draws)], 2), round(figures[int(0.975 * draws)], 2)]


def timed_block(step, n: int, device: str) -> float:
    if device == "cuda":
        torch.cuda.synchronize()  # block boundaries only: the timing needs the GPU drained
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--rounds", type=int, default=6, help="A/B rounds")
    p.add_argument("--block", type=int, default=40, help="optimizer steps per block")
    p.add_argument("--warmup", type=int, default=10, help="untimed steps per side first")
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument("--amp", choices=["none", "bf16", "fp16"], default=None,
                   help="autocast dtype (default: bf16 on cuda, none on cpu); fp16 adds a GradScaler")
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--ctx", type=int, default=None)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: all cores, at most 4)")
    p.add_argument("--out", help="also write the JSON result here")
    args = p.parse_args()
    if args.device == "cpu":
        torch.set_num_threads(args.threads or min(4, os.cpu_count() or 1))
        dim, layers, heads = 128, 2, 4
        args.ctx = args.ctx or 64
        args.batch_size = args.batch_size or 16
    else:
        dim, layers, heads = 768, 12, 12  # GPT-2 small's shape
        args.ctx = args.ctx or 512
        args.batch_size = args.batch_size or 8
    args.amp = args.amp or ("bf16" if args.device == "cuda" else "none")
    data = corpus()
    run_dir = Path(tempfile.mkdtemp(prefix="tg-overhead-"))
    plain = build(args.device, dim, layers, heads, args.ctx)
    watched = build(args.device, dim, layers, heads, args.ctx)
    scalers = [torch.amp.GradScaler(args.device) if args.amp == "fp16" else None for _ in range(2)]
    guard = trainguard.watch(*watched, total_steps=10_000, grad_accum=args.grad_accum, run_dir=run_dir,
                             scaler=scalers[1])
    # The probe's own time, measured directly: its calls on the training thread (guard.step and the
    # optimizer hooks, re-registered through a timer) and the CPU time of its background thread. The A/B
    # ratio below is the end-to-end figure; on a fast GPU step its block-to-block noise is larger than
    # the probe, and these two numbers bound what the probe can cost.
    hot = [0.0]

    def timed(fn):
        def wrapper(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                hot[0] += time.perf_counter() - t0
        return wrapper

    guard.probe._hooks.remove_optimizer_hooks()
    watched[1].register_step_pre_hook(timed(guard.probe._hooks.pre))
    watched[1].register_step_post_hook(timed(guard.probe._hooks.post))
    guard.step = timed(guard.step)
    contracts_hot = _time_contracts(guard, watched[0], watched[1])
    gen_a, gen_b = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
    step_plain = make_step(*plain, data, args, gen_a, scaler=scalers[0])
    step_guarded = make_step(*watched, data, args, gen_b, guard=guard, scaler=scalers[1])
    timed_block(step_plain, args.warmup, args.device)
    timed_block(step_guarded, args.warmup, args.device)
    mode = None
    if args.device == "cuda":
        # From here on a synchronising CUDA call in the loop, the probe's hooks or its thread raises
        # ("error"); with fp16 GradScaler.step syncs by design, so it warns and we read who warned.
        mode = "warn" if args.amp == "fp16" else "error"
        torch.cuda.set_sync_debug_mode(mode)
    plain_t, guarded_t = [], []
    hot[0] = 0.0
    contracts_hot["all"] = contracts_hot["in_step"] = 0.0
    bg_cpu0 = _thread_cpu(guard)
    rules_cpu0 = _rules_cpu(guard)
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for r in range(args.rounds):
            order = [(step_plain, plain_t), (step_guarded, guarded_t)]
            if r % 2:
                order.reverse()
            for step, sink in order:
                sink.append(timed_block(step, args.block, args.device))
    if args.device == "cuda":
        torch.cuda.set_sync_debug_mode(0)
    hot_s, bg_s = hot[0], _thread_cpu(guard) - bg_cpu0
    # the contracts' loss check runs inside guard.step: counted once, in the probe's hot path
    hot_s += contracts_hot["all"] - contracts_hot["in_step"]
    syncs = [f"{w.filename}:{w.lineno}" for w in caught if "synchroniz" in str(w.message)]
    probe_syncs = sorted({s for s in syncs if "trainguard" in s})
    guard.finish()
    log = run_dir / "guard.log"
    guard_errors = log.read_text() if log.exists() else ""
    from trainguard.store.reader import RunReader

    with RunReader(run_dir) as reader:
        rows = reader.step_count()
        memory_samples = len(reader.events("sample"))
        scales = [r["loss_scale"] for r in reader.steps() if r["loss_scale"] is not None]
    n = args.block
    result = {
        "device": args.device if args.device == "cpu" else torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "model": f"TinyLM dim={dim} layers={layers} ctx={args.ctx} batch={args.batch_size} accum={args.grad_accum}",
        "step_ms_unguarded": round(1000 * sum(plain_t) / (n * len(plain_t)), 3),
        "step_ms_guarded": round(1000 * sum(guarded_t) / (n * len(guarded_t)), 3),
        "overhead_ratio": round(sum(guarded_t) / sum(plain_t), 4),
        "overhead_pct": round(100 * (sum(guarded_t) / sum(plain_t) - 1), 2),
        "per_round_pct": [round(100 * (g / u - 1), 2) for g, u in zip(guarded_t, plain_t)],
        "median_round_pct": round(statistics.median(100 * (g / u - 1) for g, u in zip(guarded_t, plain_t)), 2),
        "overhead_pct_ci95": _bootstrap_ci(plain_t, guarded_t),
        "rows_recorded": rows,
        "probe_hot_path_ms_per_step": round(1000 * hot_s / (n * len(guarded_t)), 4),
        "probe_hot_path_pct_of_step": round(100 * hot_s / sum(guarded_t), 3),
        "probe_thread_cpu_ms_per_step": round(1000 * bg_s / (n * len(guarded_t)), 4),
        "probe_thread_cpu_pct_of_step": round(100 * bg_s / sum(guarded_t), 3),
        # of which the health rules (the probe runs them itself here: no watchdog)
        "rules_cpu_ms_per_step": round(1000 * (_rules_cpu(guard) - rules_cpu0) / (n * len(guarded_t)), 4),
        # of the hot path: the API-contract checks' hooks (optimizer, forward, gradient hooks; issue 20)
        "contracts": guard.contracts is not None,
        "contracts_hot_ms_per_step": round(1000 * contracts_hot["all"] / (n * len(guarded_t)), 4),
        "contracts_hot_pct_of_step": round(100 * contracts_hot["all"] / sum(guarded_t), 3),
        "memory_samples": memory_samples,
        "amp": args.amp,
        "sync_debug_mode": mode,
        "sync_warnings_total": len(syncs),
        "sync_warnings_from_trainguard": probe_syncs,
        "loss_scale_rows": len(scales),
        "last_loss_scale": scales[-1] if scales else None,
        "guard_errors": guard_errors[-2000:],
    }
    line = json.dumps(result)
    print(line)
    if args.out:
        Path(args.out).write_text(line + "\n")
    return 0 if not guard_errors and not probe_syncs else 1


if __name__ == "__main__":
    sys.exit(main())
