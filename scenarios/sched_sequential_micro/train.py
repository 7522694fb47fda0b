"""PyTorch's usual warmup + cosine (`SequentialLR`), sized in micro-batches (accumulation 8) but stepped
once per optimizer step: the warmup takes 80 of the 200 steps and the cosine is 8% done at the end.
The healthy twin (sched_sequential_ok) sizes both in optimizer steps."""
import sys

import torch

import trainguard
from trainguard.demo.toys import MLP, clusters, minibatch

torch.manual_seed(0); torch.set_num_threads(1)
x, y = clusters()
gen = torch.Generator().manual_seed(0)
model = MLP()
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
steps, accum = 200, 8
unit = 1 if "--optimizer-steps" in sys.argv else accum  # the bug: lengths counted in micro-batches
warmup = int(0.05 * steps) * unit
warm = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.01, total_iters=warmup)
cosine = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps * unit - warmup)
sched = torch.optim.lr_scheduler.SequentialLR(opt, [warm, cosine], milestones=[warmup])
guard = trainguard.watch(model, opt, sched, total_steps=steps, grad_accum=accum)
for micro in range(1, steps * accum + 1):
    xb, yb = minibatch(x, y, 32, gen)
    loss = torch.nn.functional.cross_entropy(model(xb), yb)
    (loss / accum).backward()
    guard.step(loss)
    if micro % accum == 0:
        opt.step(); sched.step(); opt.zero_grad()
guard.finish()
