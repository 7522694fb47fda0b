"""Healthy twin of memory_creep: the same 2 MiB entries, but the cache keeps only the last 8. Must stay quiet.

Runs 300 of its planned 2,000 steps, longer than the leaking twin."""
import time

import torch

import trainguard
from trainguard.demo.toys import MLP, clusters, minibatch

torch.manual_seed(0); torch.set_num_threads(1)
x, y = clusters()
gen = torch.Generator().manual_seed(0)
model = MLP()
opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
steps = 2000
cache = {}
guard = trainguard.watch(model, opt, total_steps=steps)
for step in range(1, steps + 1):
    xb, yb = minibatch(x, y, 64, gen)
    cache[step] = torch.ones(512 * 1024)
    cache.pop(step - 8, None)
    loss = torch.nn.functional.cross_entropy(model(xb), yb)
    loss.backward(); opt.step(); opt.zero_grad()
    guard.step(loss)
    time.sleep(0.02)
    if step == 300:
        break
guard.finish()
