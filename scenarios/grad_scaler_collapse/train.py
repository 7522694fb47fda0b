"""A GradScaler hides non-finite gradients by skipping steps: here every step, so the scale collapses."""
import torch

import trainguard
from trainguard.demo.toys import MLP, clusters, minibatch

torch.manual_seed(0); torch.set_num_threads(1)
x, y = clusters()
gen = torch.Generator().manual_seed(0)
model = MLP()
opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
scaler = torch.amp.GradScaler("cpu")
anchor = [p.detach().clone() for p in model.parameters()]
steps = 200
guard = trainguard.watch(model, opt, total_steps=steps, scaler=scaler)
for step in range(1, steps + 1):
    xb, yb = minibatch(x, y, 64, gen)
    loss = torch.nn.functional.cross_entropy(model(xb), yb)
    dist = sum(((p - a) ** 2).sum() for p, a in zip(model.parameters(), anchor))
    loss = loss + 1e-3 * torch.sqrt(dist)  # sqrt at 0: inf/NaN gradients, every step (the weights never move)
    scaler.scale(loss).backward()
    scaler.step(opt); scaler.update(); opt.zero_grad()
    guard.step(loss)
guard.finish()
