"""Healthy but noisy: tiny batches and 30% label noise make every step's loss jump around. Must stay quiet."""
import torch

import trainguard
from trainguard.demo.toys import MLP, clusters, minibatch

torch.manual_seed(0); torch.set_num_threads(1)
x, y = clusters()
noisy = torch.rand(len(y), generator=torch.Generator().manual_seed(3)) < 0.3
y = torch.where(noisy, torch.randint(10, y.shape, generator=torch.Generator().manual_seed(4)), y)
gen = torch.Generator().manual_seed(0)
model = MLP()
opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
steps = 600
guard = trainguard.watch(model, opt, total_steps=steps)
for step in range(1, steps + 1):
    xb, yb = minibatch(x, y, 4, gen)
    loss = torch.nn.functional.cross_entropy(model(xb), yb)
    loss.backward(); opt.step(); opt.zero_grad()
    guard.step(loss)
guard.finish()
