"""Healthy twin of grad_scaler_collapse: a GradScaler over finite gradients. Must stay quiet."""
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
    loss = loss + 1e-3 * torch.sqrt(dist + 1e-12)
    scaler.scale(loss).backward()
    scaler.step(opt); scaler.update(); opt.zero_grad()
    guard.step(loss)
guard.finish()
