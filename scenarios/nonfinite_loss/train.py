"""One corrupt sample (an inf feature) at step 150: the loss is NaN there; the loop skips that update."""
import torch

import trainguard
from trainguard.demo.toys import MLP, clusters, minibatch

torch.manual_seed(0); torch.set_num_threads(1)
x, y = clusters()
gen = torch.Generator().manual_seed(0)


def loader(steps):
    for step in range(1, steps + 1):
        xb, yb = minibatch(x, y, 64, gen)
        if step == 150:
            xb[3, 5] = float("inf")
        yield xb, yb


model = MLP()
opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
steps = 300
guard = trainguard.watch(model, opt, total_steps=steps)
for xb, yb in guard.batches(loader(steps)):
    loss = torch.nn.functional.cross_entropy(model(xb), yb)
    guard.step(loss)
    if torch.isfinite(loss):
        loss.backward(); opt.step()
    opt.zero_grad()
guard.finish()
