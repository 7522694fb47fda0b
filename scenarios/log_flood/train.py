"""Seed 004's log: per-part debug lines on every step, 20 lines an optimizer step.

Each step sleeps 50 ms (a real step is slower than this toy's): the watchdog counts lines twice a second,
so detection in steps depends on the step rate; at 20 steps a second it stays within issue 4's budget
with room for a loaded machine.
"""
import time

import torch

import trainguard
from trainguard.demo.toys import MLP, clusters, minibatch

torch.manual_seed(0); torch.set_num_threads(1)
x, y = clusters()
gen = torch.Generator().manual_seed(0)
model = MLP()
opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
steps = 1000
guard = trainguard.watch(model, opt, total_steps=steps)
for step in range(1, steps + 1):
    xb, yb = minibatch(x, y, 64, gen)
    loss = torch.nn.functional.cross_entropy(model(xb), yb)
    loss.backward(); opt.step(); opt.zero_grad()
    guard.step(loss)
    for i in range(20):
        print(f"[debug] step {step} layer {i}: ok")
    time.sleep(0.05)
    if step == 150:
        break  # enough to see it; the planned length stays 1000
guard.finish()
