"""Saves every 20 steps, but the condition also requires step <= 200 (meant for a debug run): no more saves."""
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
    if step % 20 == 0 and step <= 200:  # the bug
        torch.save(model.state_dict(), "ckpt.pt"); guard.checkpoint_saved("ckpt.pt")
    if step == 300:
        break  # enough to see it
guard.finish()
