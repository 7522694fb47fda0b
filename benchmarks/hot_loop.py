"""The fair harness's loop alone, guarded or not, for a sampling profiler: where the probe's time goes.

    python benchmarks/hot_loop.py --shape launch --steps 1500            # guarded (the whole API)
    python benchmarks/hot_loop.py --shape launch --steps 1500 --unguarded
    py-spy record -r 1000 -f raw -o g.raw -- python benchmarks/hot_loop.py --shape launch
    python benchmarks/hot_loop.py --share g.raw                          # the probe's share, by entry point

`fair_overhead.py` times the probe's calls from outside (a timer around each call and hook) and compares
whole blocks; a sampling profiler sees inside them without adding a cost per call. The loop is the same:
micro-batches with `guard.batches`, `guard.step(loss, parts=..., weights=...)`, clipping, the optimizer
and scheduler, `due("eval")` with an evaluation in `phase("eval")`, all in `phase("train")`. It prints the
training thread's CPU and wall time per optimizer step. `--share` reads py-spy's raw (collapsed) output:
of the training thread's samples, the share under each trainguard function the loop or torch called
(the loader's own work under `guard.batches` is the loop's, not the probe's), and the deepest trainguard
function under each.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import re
import sys
import tempfile
import time

SHAPES = {  # fair_overhead.py's arms (the launch-bound one, and its CPU proxy)
    "launch": dict(vocab=50304, dim=256, layers=4, heads=4, ctx=256, micro=1, accum=4),
    "launch-cpu": dict(vocab=256, dim=64, layers=4, heads=4, ctx=32, micro=1, accum=4),
    "tiny": dict(vocab=64, dim=16, layers=2, heads=2, ctx=8, micro=1, accum=4),
}


def train(args: argparse.Namespace) -> None:
    import torch
    import torch.nn.functional as F

    from trainguard.demo.tinylm import TinyLM, corpus

    cfg = SHAPES[args.shape]
    device = args.device or ("cuda" if torch.cuda.is_available() and args.shape == "launch" else "cpu")
    if device == "cpu":
        torch.set_num_threads(1)
    torch.manual_seed(0)
    model = TinyLM(vocab=cfg["vocab"], dim=cfg["dim"], layers=cfg["layers"], heads=cfg["heads"],
                   ctx=cfg["ctx"]).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 100))
    data = (corpus(repeat=2000) % cfg["vocab"]).to(device)
    accum, ctx, eval_every = cfg["accum"], cfg["ctx"], 25
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if device == "cuda" else contextlib.nullcontext()
    guard = None
    if not args.unguarded:
        import trainguard

        guard = trainguard.watch(model, opt, sched, total_steps=100_000, grad_accum=accum,
                                 run_dir=tempfile.mkdtemp(prefix="tg-hot-"))
    gen = torch.Generator(device=device).manual_seed(1)

    def get_batch():
        ix = torch.randint(len(data) - ctx - 1, (cfg["micro"],), generator=gen, device=device)
        offsets = torch.arange(ctx, device=device)
        return data[ix[:, None] + offsets], data[ix[:, None] + offsets + 1]

    def loader():
        while True:
            yield get_batch()

    def evaluate():
        model.eval()
        with torch.no_grad(), amp:
            losses = [F.cross_entropy(model(x).flatten(0, 1), y.flatten()) for x, y in (get_batch(), get_batch())]
        model.train()
        return torch.stack(losses).mean()

    phase = guard.phase if guard is not None else (lambda name: contextlib.nullcontext())
    batches = guard.batches(loader()) if guard is not None else loader()
    weights = {"nll": 0.9, "smooth": 0.1}
    step, t0, c0 = 0, None, None
    with phase("train"):
        for micro, (x, y) in enumerate(batches, start=1):
            with amp:
                logp = F.log_softmax(model(x).float(), dim=-1)
                nll = F.nll_loss(logp.flatten(0, 1), y.flatten())
                smooth = -logp.mean()
            loss = 0.9 * nll + 0.1 * smooth
            (loss / accum).backward()
            if guard is not None:
                guard.step(loss, parts={"nll": nll, "smooth": smooth}, weights=weights)
            if micro % accum:
                continue
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            if step == args.warmup:
                if device == "cuda":
                    torch.cuda.synchronize()
                t0, c0 = time.perf_counter(), time.thread_time()
            due = guard.due("eval", eval_every) if guard is not None else step % eval_every == 0
            if due:
                with phase("eval"):
                    val = evaluate()
                    if guard is not None:
                        guard.eval(loss=val)
                    else:
                        float(val)
            if step >= args.warmup + args.steps:
                break
    if device == "cuda":
        torch.cuda.synchronize()
    wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
    side = "unguarded" if guard is None else "guarded"
    print(f"{side} {args.shape} on {device}: {1000 * cpu / args.steps:.3f} ms thread CPU, "
          f"{1000 * wall / args.steps:.3f} ms wall per optimizer step ({args.steps} steps)", flush=True)
    if guard is not None:
        guard.finish()


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
        if not any(f.startswith("train (") and "hot_loop.py" in f for f in frames):
            continue  # another thread: the training thread is the one inside train()
        n = int(count)
        total += n
        at = [i for i, f in enumerate(frames) if ours(f)]
        if not at or any("hot_loop.py" in f for f in frames[at[0] + 1:]):
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
    p.add_argument("--shape", choices=sorted(SHAPES), default="launch-cpu")
    p.add_argument("--device", help="cuda or cpu (default: cuda for the launch shape where there is one)")
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
