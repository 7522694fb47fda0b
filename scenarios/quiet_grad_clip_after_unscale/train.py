"""Healthy twin of grad_clip_before_unscale: `scaler.unscale_(opt)` first, then the clip. This model's gradient
norm is above 1.0, so the clip is active at every step and the norm the optimizer receives is pinned at
max_norm 1.0 (0.999999): pinned, but at max_norm itself, not at max_norm / scale. Must stay quiet."""
import torch

import trainguard
from trainguard.demo.toys import MLP, clusters, minibatch

torch.manual_seed(0); torch.set_num_threads(1)
x, y = clusters()
gen = torch.Generator().manual_seed(0)
model = MLP()
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
scaler = torch.amp.GradScaler("cpu")
steps = 400
guard = trainguard.watch(model, opt, total_steps=steps)
for step in range(1, steps + 1):
    xb, yb = minibatch(x, y, 64, gen)
    loss = torch.nn.functional.cross_entropy(model(xb), yb)
    scaler.scale(loss).backward()
    scaler.unscale_(opt)  # unscaled first, as the AMP examples say
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)  # active: the norm is pinned at 1.0
    scaler.step(opt); scaler.update(); opt.zero_grad()
    guard.step(loss)
    if step == 100:
        break  # enough to see it; the planned length stays 400
guard.finish()
