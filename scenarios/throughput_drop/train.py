"""From step 500 each step waits 30 ms more: stands for a dataloader worker that died and a synchronous fallback."""
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
    if step >= 500:
        time.sleep(0.03)
    xb, yb = minibatch(x, y, 64, gen)
    loss = torch.nn.functional.cross_entropy(model(xb), yb)
    loss.backward(); opt.step(); opt.zero_grad()
    guard.step(loss)
    if step == 560:
        break  # enough to see it; the planned length stays 1000
guard.finish()
