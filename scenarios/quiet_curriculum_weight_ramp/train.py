"""Healthy: an auxiliary loss whose weight ramps from 0.06 to 0.99 over the run (a curriculum), reported
every step. The weighted total rises by design while every part falls or holds: not a divergence."""
import torch

import trainguard
from trainguard.demo.toys import MLP, clusters, minibatch

torch.manual_seed(0); torch.set_num_threads(1)
x, y = clusters()
gen = torch.Generator().manual_seed(0)
model = MLP()
opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
steps = 600
guard = trainguard.watch(model, opt, total_steps=steps)
for step in range(1, steps + 1):
    xb, yb = minibatch(x, y, 64, gen)
    h = model.body(xb)
    ce = torch.nn.functional.cross_entropy(model.head(h), yb)
    # an auxiliary target with irreducible noise (a denoising term): it holds near 3 whatever the model does
    aux = ((h[:, :16] - 1.7 * torch.randn(64, 16, generator=gen)) ** 2).mean()
    w = {"ce": 1.0, "aux": 0.06 + 0.93 * step / steps}
    loss = w["ce"] * ce + w["aux"] * aux
    loss.backward(); opt.step(); opt.zero_grad()
    guard.step(loss, parts={"ce": ce, "aux": aux}, weights=w)
guard.finish()
