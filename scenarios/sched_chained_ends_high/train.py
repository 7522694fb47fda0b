"""Warmup + cosine as a `ChainedScheduler`, the cosine sized in micro-batches (accumulation 8) and
stepped per optimizer step: the run ends with the LR at 96% of its peak, never annealed. The healthy
twin (sched_chained_ok) sizes the cosine in optimizer steps."""
import sys

import torch

import trainguard
from trainguard.demo.toys import MLP, clusters, minibatch

torch.manual_seed(0); torch.set_num_threads(1)
x, y = clusters()
gen = torch.Generator().manual_seed(0)
model = MLP()
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
steps, accum = 240, 8
t_max = steps if "--optimizer-steps" in sys.argv else steps * accum  # the bug: micro-batches
sched = torch.optim.lr_scheduler.ChainedScheduler([
    torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.1, total_iters=10),
    torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=t_max),
])
guard = trainguard.watch(model, opt, sched, total_steps=steps, grad_accum=accum)
for micro in range(1, steps * accum + 1):
    xb, yb = minibatch(x, y, 32, gen)
    loss = torch.nn.functional.cross_entropy(model(xb), yb)
    (loss / accum).backward()
    guard.step(loss)
    if micro % accum == 0:
        opt.step(); sched.step(); opt.zero_grad()
guard.finish()
