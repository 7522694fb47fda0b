"""What finding the model through torch's global module hooks costs a forward (probe/modulesight.py).

    python benchmarks/modulesight_cost.py                # CPU, a 12-block MLP of batch 1 (Python-bound)
    python benchmarks/modulesight_cost.py --blocks 48 --width 256 --device cuda

Under `trainguard run` with no code change the automatic probe finds the model with a global forward
pre-hook, then hooks the model alone, as `watch(model, ...)` does. Four arms, one model, one process, the
forwards of a training step (train mode, gradients on, an unsampled step), interleaved in rounds:

- none: no hook of ours at all (the reference);
- torch-global: a global pre-hook that returns at once: what torch's slow path through `Module._call_impl`
  costs every module call while any global hook exists;
- window: the probe's global hook while its discovery window is open, the root already found (each call
  one dictionary question);
- after: the window closed: the contract checks' one pre-hook on the root, as under `watch()`.

Prints one JSON line: microseconds per forward (median of the rounds) and each arm's overhead over none,
with the machine's load average beside them (the numbers move with it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=12, help="Linear+ReLU blocks (modules = 2 * blocks + 1)")
    ap.add_argument("--width", type=int, default=32)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--forwards", type=int, default=2000, help="forwards per arm and round")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()

    import torch
    from torch.nn.modules.module import register_module_forward_pre_hook

    from trainguard.probe import modulesight
    from trainguard.probe.core import Probe

    torch.set_num_threads(1)
    dev = torch.device(args.device)
    layers: list[torch.nn.Module] = []
    for _ in range(args.blocks):
        layers += [torch.nn.Linear(args.width, args.width), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(args.batch, args.width, device=dev)
    os.environ.setdefault("TRAINGUARD_RUNS_ROOT", tempfile.mkdtemp(prefix="tg-sight-"))
    probe = Probe(None, opt, run_dir=tempfile.mkdtemp(prefix="tg-sight-run-"), auto=True)
    for _ in range(5):  # past the first sampled steps: step 6 is an unsampled one
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()

    def forwards() -> float:
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(args.forwards):
            model(x)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        return (time.perf_counter() - t0) / args.forwards * 1e6

    noop = register_module_forward_pre_hook(lambda m, a: None)
    noop.remove()
    modulesight.CONFIRM_FORWARDS = 1 << 60  # keep the window open for its arm
    sight = modulesight.ModuleSight(probe, probe._contracts, opt)
    sight.until = 1 << 60
    sight.install()
    model(x)  # the root is found here, the contract hook put on it
    sight.close()
    root_hooks = dict(model._forward_pre_hooks)
    times: dict[str, list[float]] = {"none": [], "torch-global": [], "window": [], "after": []}
    for _ in range(args.rounds):
        for arm in times:
            model._forward_pre_hooks.clear()
            if arm in ("window", "after"):
                model._forward_pre_hooks.update(root_hooks)
            handle = None
            if arm == "torch-global":
                handle = register_module_forward_pre_hook(lambda m, a: None)
            elif arm == "window":
                sight.install()
            times[arm].append(forwards())
            if handle is not None:
                handle.remove()
            sight.close()
    med = {arm: statistics.median(v) for arm, v in times.items()}
    print(json.dumps({
        "device": str(dev), "modules": sum(1 for _ in model.modules()), "batch": args.batch,
        "width": args.width, "load_avg_1m": round(os.getloadavg()[0], 2), "cpus": os.cpu_count(),
        "us_per_forward": {k: round(v, 2) for k, v in med.items()},
        "overhead_us": {k: round(v - med["none"], 2) for k, v in med.items() if k != "none"},
        "model_seen": type(sight.root).__name__ if sight.root is not None else None,
    }))
    probe.finish()


if __name__ == "__main__":
    main()
