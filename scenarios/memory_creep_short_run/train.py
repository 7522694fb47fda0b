"""A short run (120 steps) whose host memory grows 2 MiB every step: a per-step cache nothing evicts.

The memory rule leaves the first 100 steps to the warm-up, so a run this short was never judged and its
report said TG524 "passed" (issue 31: a leak of 5.2x in a 120-step run). Judged at its end, by its growth a
step. Each step sleeps 20 ms: the sleep stands for a slower real step."""
import time

import torch

import trainguard
from trainguard.demo.toys import MLP, clusters, minibatch

torch.manual_seed(0); torch.set_num_threads(1)
x, y = clusters()
gen = torch.Generator().manual_seed(0)
model = MLP()
opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
steps = 120
cache = {}
guard = trainguard.watch(model, opt, total_steps=steps)
for step in range(1, steps + 1):
    xb, yb = minibatch(x, y, 64, gen)
    cache[step] = torch.ones(512 * 1024)  # the leak: 2 MiB a step, never evicted
    loss = torch.nn.functional.cross_entropy(model(xb), yb)
    loss.backward(); opt.step(); opt.zero_grad()
    guard.step(loss)
    time.sleep(0.02)
guard.finish()
