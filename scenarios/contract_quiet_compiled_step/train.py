"""Healthy twin of contract_compiled_step_noop: the same compiled Adam step, warmed up before any backward,
with dynamo's guards kept: the guard on the gradients recompiles the step at the first real one.
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
opt_step = torch.compile(opt.step, backend="eager")
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
