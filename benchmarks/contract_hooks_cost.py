"""The contract checks' hooks (probe/contracts.py), their cost per optimizer step on the training thread.

    python benchmarks/contract_hooks_cost.py                # the launch-bound and GPU-bound arms' shapes
    python benchmarks/contract_hooks_cost.py --shape gpu

The model and the guard are real (fair_overhead.py's TinyLM shapes, `trainguard.watch`); what is timed
is the hooks alone, called in the order one optimizer step calls them: per micro-batch the forward pre-
hooks, the layers' forward hooks, the forward post-hook (there only for a forward whose pre-hook put
it on: `post_due`), the gradient hooks (tensor hooks before the gradient is added to, post-accumulate hooks
after), the loss check after a sampled forward; then the optimizer's pre- and post-hook halves
(`opt_pre`, `opt_post`, called from the guard's optimizer hooks).
Which hooks there are is read from torch's own hook dictionaries (every hook a function of
probe/contracts.py or its families of checks registered on the model, its modules or its parameters), so no hook is missed
whatever the checks register. Steps 11-110 are timed, so that the sampled steps (every `stats_every`)
count in the mean; each hook call is timed on its own (the replayed backward's accumulation,
`grad[:1].add_(0)`, is not), and each step's calls of a kind count as the best of 7 passes (a loaded
machine's interruptions fall out). A gradient reset (`zero_grad(set_to_none=False)`) is replayed
each step, so the healthy path is the one timed. Without the model's own work the figure is the hooks'
cost and nothing else: on a loaded machine it is still the most stable measure there is.

`calls_per_step` counts the Python entries: each gradient hook's call takes the interpreter lock back
in the middle of a backward pass (on the autograd engine's own thread on a GPU).
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


def _ours(fn) -> bool:
    fn = getattr(fn, "__func__", fn)
    return (getattr(fn, "__module__", "") or "").startswith("trainguard.probe.contract")  # the dispatcher, its families


def contract_hooks(model) -> dict[str, list]:
    """The hooks the contract checks (probe/contract*.py) registered, by kind: [(module or parameter, hook), ...]."""
    found: dict[str, list] = {"forward_pre": [], "forward": [], "grad_before": [], "grad_after": []}
    for m in model.modules():
        found["forward_pre"] += [(m, fn, k in m._forward_pre_hooks_with_kwargs)
                                 for k, fn in m._forward_pre_hooks.items() if _ours(fn)]
        found["forward"] += [(m, fn, k in m._forward_hooks_with_kwargs) for k, fn in m._forward_hooks.items() if _ours(fn)]
    for p in model.parameters():
        found["grad_before"] += [(p, fn) for fn in (getattr(p, "_backward_hooks", None) or {}).values() if _ours(fn)]
        found["grad_after"] += [(p, fn) for fn in (getattr(p, "_post_accumulate_grad_hooks", None) or {}).values()
                                if _ours(fn)]
    return found


def measure(shape: str, passes: int = 7, steps: int = 100) -> dict:
    import torch

    import trainguard
    from trainguard.demo.tinylm import TinyLM

    cfg = SHAPES[shape]
    torch.manual_seed(0)
    model = TinyLM(vocab=cfg["vocab"], dim=cfg["dim"], layers=cfg["layers"], heads=cfg["heads"], ctx=64)
    opt = torch.optim.AdamW(model.parameters())
    guard = trainguard.watch(model, opt, grad_accum=cfg["accum"], run_dir=tempfile.mkdtemp(prefix="tg-hooks-"))
    checks = guard.contracts
    if checks is None:
        raise SystemExit("the contract checks are off (TRAINGUARD_CONTRACTS=0)")
    x = torch.randint(0, cfg["vocab"], (1, 16))
    out = model(x)
    out.float().sum().backward()  # every parameter has a gradient, as in training
    loss = torch.tensor(1.0)
    layer_out = out.to(torch.bfloat16)  # what a layer returns under the arms' autocast
    pc = time.perf_counter
    spent: dict[str, float] = {}  # this step's seconds by kind of call
    watched: set[int] = set()  # parameters whose gradient the checks followed
    calls: dict[str, int] = {}

    def timed(kind: str, fn, *args) -> None:
        t0 = pc()
        fn(*args)
        spent[kind] = spent.get(kind, 0.0) + pc() - t0
        calls[kind] = calls.get(kind, 0) + 1

    def one_step() -> None:
        timed("opt_post", checks.opt_post, opt)  # the previous step's end (the next window starts here)
        hooks = contract_hooks(model)  # (read anew: the checks may move, drop or take out their hooks)
        grads = {id(p): p for p, _ in hooks["grad_before"] + hooks["grad_after"]}.values()
        watched.update(id(p) for p in grads)
        for p in grads:
            p.grad[:1].zero_()  # zero_grad(set_to_none=False): the version counter moves
        for _ in range(cfg["accum"]):
            now = contract_hooks(model)  # (a hook may take itself out for the rest of the step)
            for m, fn, kw in now["forward_pre"]:
                timed("forward_pre", fn, *((m, (x,), {}) if kw else (m, (x,))))
            now = contract_hooks(model)  # (a pre-hook may have put hooks on the layers for this forward)
            inner = [(m, fn, kw) for m, fn, kw in now["forward"] if m is not model]  # (a layer's run first)
            for m, fn, kw in inner:
                timed("forward_layers", fn, *((m, (x,), {}, layer_out) if kw else (m, (x,), layer_out)))
            # (the post-hook on the model is there only for a forward that needs it: the pre-hook put it on)
            for m, fn, kw in now["forward"]:
                if m is model:
                    timed("forward", fn, *((m, (x,), {}, out) if kw else (m, (x,), out)))
            now = contract_hooks(model)
            for p, fn in now["grad_before"]:
                timed("grad_before", fn, p.grad)
            for p in grads:
                p.grad[:1].add_(0)  # the backward pass adds to the gradient in place (untimed)
            for p, fn in now["grad_after"]:
                timed("grad_after", fn, p)
            guard.state.micro += 1
            if checks.shapes.last_output is not None:  # as guard.step calls it: only after a sampled forward
                timed("on_loss", checks.on_loss, loss)
        guard.state.opt_steps += 1
        timed("opt_pre", checks.opt_pre, opt)

    autocast = torch.autocast("cpu", dtype=torch.bfloat16)  # as the arms run (bf16): the autocast check runs
    best: dict[tuple[int, str], float] = {}  # (step, kind) -> the least seconds over the passes
    with autocast:
        for _ in range(passes):
            guard.state.opt_steps = 10
            calls.clear()
            for i in range(steps):
                spent.clear()
                one_step()
                for kind, dt in spent.items():
                    best[i, kind] = min(best.get((i, kind), dt), dt)
    by_kind: dict[str, float] = {}
    for (_, kind), dt in best.items():
        by_kind[kind] = by_kind.get(kind, 0.0) + dt / steps
    guard.state.disabled = True  # the replayed counters are not a run to record
    return {"shape": shape, "tensors": len(list(model.parameters())), "micro_batches": cfg["accum"],
            "grad_watched": len(watched),
            "hooks_us_per_step": round(1e6 * sum(by_kind.values()), 1),
            "us_per_step": {k: round(1e6 * v, 2) for k, v in sorted(by_kind.items())},
            "calls_per_step": {k: round(v / steps, 2) for k, v in sorted(calls.items())},
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
