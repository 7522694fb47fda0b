"""At step 100 a weight-anchoring penalty starts with the anchor equal to the weights: sqrt(0) has an
infinite derivative, so the gradients are NaN while the loss is finite."""
import torch

import trainguard
from trainguard.demo.toys import MLP, clusters, minibatch

torch.manual_seed(0); torch.set_num_threads(1)
x, y = clusters()
gen = torch.Generator().manual_seed(0)
model = MLP()
opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
steps = 300
guard = trainguard.watch(model, opt, total_steps=steps)
anchor = None
for step in range(1, steps + 1):
    xb, yb = minibatch(x, y, 64, gen)
    loss = torch.nn.functional.cross_entropy(model(xb), yb)
    if step == 100:
        anchor = [p.detach().clone() for p in model.parameters()]
    if anchor is not None:
        dist = sum(((p - a) ** 2).sum() for p, a in zip(model.parameters(), anchor))
        loss = loss + 1e-3 * torch.sqrt(dist)  # the bug: sqrt at 0
    loss.backward(); opt.step(); opt.zero_grad()
    guard.step(loss)
guard.finish()
