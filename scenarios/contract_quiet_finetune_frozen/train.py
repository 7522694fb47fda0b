"""Healthy twin of contract_step_updates_nothing and contract_frozen_params_updated: the backbone is
frozen after warm-up (gradients set to None, the default), the head keeps learning."""
import torch
from torch import nn

import trainguard
from trainguard.demo.toys import MLP, clusters, minibatch

torch.manual_seed(0); torch.set_num_threads(1)
x, y = clusters()
gen = torch.Generator().manual_seed(0)
model = MLP()
opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.05)
steps, freeze_at = 200, 30
guard = trainguard.watch(model, opt, total_steps=steps)
for step in range(1, steps + 1):
    if step == freeze_at + 1:
        for p in model.body.parameters():
            p.requires_grad = False
    xb, yb = minibatch(x, y, 64, gen)
    loss = nn.functional.cross_entropy(model(xb), yb)
    opt.zero_grad()
    loss.backward()
    opt.step()
    guard.step(loss)
guard.finish()
