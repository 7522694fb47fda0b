"""The contract checks' hooks (probe/contracts.py), their cost per optimizer step on the training thread.

    python benchmarks/contract_hooks_cost.py                # the launch-bound and GPU-bound arms' shapes
    python benchmarks/contract_hooks_cost.py --shape gpu

The model and the guard are real (fair_overhead.py's TinyLM shapes, `trainguard.watch`); what is timed
is the hooks alone, called in the order one optimizer step calls them (per micro-batch: the forward pre-
and post-hooks, the gradient hooks while they are registered, the loss check; then the optimizer's pre-
and post-hooks), for steps 11-110 so that the sampled steps (every `stats_every`) count in the mean, as
the best of 7 passes. A gradient reset (`zero_grad(set_to_none=False)`) is replayed each step, so the
healthy path is the one timed. Without the model's own work the figure is the hooks' cost and nothing
else: on a loaded machine it is still the most stable measure there is.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

SHAPES = {  # fair_overhead.py's arms: (dim, layers, heads, vocab, micro-batches per optimizer step)
    "launch": dict(dim=256, layers=4, heads=4, vocab=50304, accum=4),
    "gpu": dict(dim=768, layers=12, heads=12, vocab=50304, accum=2),
}


def measure(shape: str, passes: int = 7, steps: int = 100) -> dict:
    import torch

    import trainguard
    from trainguard.demo.tinylm import TinyLM

    cfg = SHAPES[shape]
    torch.manual_seed(0)
    model = TinyLM(vocab=cfg["vocab"], dim=cfg["dim"], layers=cfg["layers"], heads=cfg["heads"], ctx=64)
    opt = torch.optim.AdamW(model.parameters())
    guard = trainguard.watch(model, opt, grad_accum=cfg["accum"], run_dir=tempfile.mkdtemp(prefix="tg-hooks-"))
    checks = guard._contracts
    if checks is None:
        raise SystemExit("the contract checks are off (TRAINGUARD_CONTRACTS=0)")
    x = torch.randint(0, cfg["vocab"], (1, 16))
    out = model(x)
    out.float().sum().backward()  # every parameter has a gradient, as in training
    loss = torch.tensor(1.0)
    grad_hooks = [(w, checks._before_accumulate(w), checks._after_accumulate(w)) for w in checks.grad_watch]

    def one_step() -> None:
        checks.opt_post(opt)  # the previous step's end (it decides whether the next window is followed)
        for w, _, _ in grad_hooks:
            w.param.grad[:1].zero_()  # zero_grad(set_to_none=False): the version counter moves
        for _ in range(cfg["accum"]):
            checks._forward_pre(model, (x,), {})
            checks.forward_post(model, (x,), {}, out)
            for w, before, after in grad_hooks:
                if getattr(w, "handles", True):  # registered now (always, where the hooks never come off)
                    before(w.param.grad)
                    after(w.param)
            guard.micro += 1
            if checks.last_output is not None:  # as guard.step calls it: only after a sampled forward
                checks.on_loss(loss)
        guard.opt_steps += 1
        checks.opt_pre(opt)

    autocast = torch.autocast("cpu", dtype=torch.bfloat16)  # as the arms run (bf16): the autocast check runs
    best = float("inf")
    with autocast:
        for _ in range(passes):
            guard.opt_steps = 10
            t0 = time.perf_counter()
            for _ in range(steps):
                one_step()
            best = min(best, (time.perf_counter() - t0) / steps)
    guard._disabled = True  # the replayed counters are not a run to record
    return {"shape": shape, "tensors": len(list(model.parameters())), "micro_batches": cfg["accum"],
            "grad_watched": len(grad_hooks), "hooks_us_per_step": round(1e6 * best, 1),
            "contracts_reported": sorted(checks.sent)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=sorted(SHAPES), action="append")
    args = p.parse_args()
    import torch

    torch.set_num_threads(1)
    for shape in args.shape or sorted(SHAPES):
        print(json.dumps(measure(shape)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
