"""Seed 002 in miniature: a scheduler sized in optimizer steps but stepped once per micro-batch.

    trainguard run -- python -m trainguard.demo.lr_per_microbatch

Gradient accumulation 16, a warmup-then-linear-decay schedule for 120 optimizer steps, and
`scheduler.step()` one line too far out, so it runs 16 times per optimizer step: the schedule is over
after 1/16 of the run and the LR sits at 0 for the rest. Nothing crashes and the loss just stops
improving, which is how the seed's run went on for hours.
"""

from __future__ import annotations

import time

import torch

import trainguard
from trainguard.demo.toys import MLP, clusters, minibatch, warmup_linear

torch.manual_seed(0)
torch.set_num_threads(1)
x, y = clusters()
x_val, y_val = clusters(512, seed=1)
gen = torch.Generator().manual_seed(0)

steps, grad_accum = 120, 16
model = MLP()
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_linear(num_warmup_steps=12, num_training_steps=steps))
guard = trainguard.watch(model, optimizer, scheduler, total_steps=steps, grad_accum=grad_accum)

for micro in range(steps * grad_accum):
    xb, yb = minibatch(x, y, 32, gen)
    loss = torch.nn.functional.cross_entropy(model(xb), yb)
    (loss / grad_accum).backward()
    guard.step(loss)
    if (micro + 1) % grad_accum == 0:
        optimizer.step()
        optimizer.zero_grad()
        # A real run's step takes a while; this toy's takes a millisecond, and its 120 steps would be over
        # before the watchdog (polling every half second, later on a loaded machine) could stop it.
        time.sleep(0.08)
    scheduler.step()  # the bug: once per micro-batch, while the schedule counts optimizer steps
    if guard.due("eval", every=20):
        with torch.no_grad():
            guard.eval(loss=torch.nn.functional.cross_entropy(model(x_val), y_val))
guard.finish()
