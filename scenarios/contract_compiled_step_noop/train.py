"""A compiled optimizer step that replays the no-op it was traced as (TG201 weights-not-updating, cause compiled-step).

`torch.compile(opt.step)` is warmed up once before the loop, as one warms up a compiled function so the
timed loop does not pay for the compile, but before any backward: every gradient is None, and Adam's step
traced then does nothing. Dynamo's guard on the gradients would recompile at the first real step; this
script drops the guards to save their per-call cost (`torch.compiler.skip_all_guards_unsafe`, from PyTorch's
"Reducing Guard Overhead" page), so the no-op replays at every step and the loss never moves. Modelled on
pytorch/pytorch#115607 ("dynamo does not correctly handle future iterations if a specific iteration is
frozen", labelled "module: correctness (silent)"): dynamo lacked that guard, so once a step had run with
every gradient None its cached no-op replayed and Adam's step count stayed at 3; PR #121291 added the
guard in torch 2.3, and dropping the guards here gives today what dynamo did then. backend="eager" keeps
the scenario fast: the no-op is dynamo's cache, before any backend.
"""
import torch
from torch import nn

import trainguard
from trainguard.demo.toys import MLP, clusters, minibatch

torch.manual_seed(0); torch.set_num_threads(1)
x, y = clusters()
gen = torch.Generator().manual_seed(0)
model = MLP()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
steps = 60
guard = trainguard.watch(model, opt, total_steps=steps + 1)
opt_step = torch.compile(opt.step, backend="eager",
                         options={"guard_filter_fn": torch.compiler.skip_all_guards_unsafe})  # the bug
opt_step()  # warm up the compile before the loop (no backward yet: every gradient is None)
for step in range(1, steps + 1):
    xb, yb = minibatch(x, y, 64, gen)
    loss = nn.functional.cross_entropy(model(xb), yb)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt_step()
    guard.step(loss)
    if step % 20 == 0:
        print(f"step {step}: loss {loss.item():.4f}")
guard.finish()
