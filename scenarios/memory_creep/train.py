"""An augmentation cache keyed by step that nothing evicts: host memory grows 2 MiB every step.

The run plans 2,000 steps and stops at 200 (enough to see it; the planned length stays 2,000). Each step
sleeps 20 ms: the sleep stands for a slower real step."""
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
    cache[step] = torch.ones(512 * 1024)  # the leak: 2 MiB a step, never evicted
    loss = torch.nn.functional.cross_entropy(model(xb), yb)
    loss.backward(); opt.step(); opt.zero_grad()
    guard.step(loss)
    time.sleep(0.02)
    if step == 200:
        break
guard.finish()
