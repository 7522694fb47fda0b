"""An auxiliary head is built and optimised but the forward never calls it: its parameters get no gradient."""
import torch

import trainguard
from trainguard.demo.toys import MLP, clusters, minibatch

torch.manual_seed(0); torch.set_num_threads(1)
x, y = clusters()
gen = torch.Generator().manual_seed(0)
model = MLP()
model.aux = torch.nn.Linear(64, 4)  # meant for an auxiliary loss that was never wired in
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
steps = 150
guard = trainguard.watch(model, opt, total_steps=steps)
for step in range(1, steps + 1):
    xb, yb = minibatch(x, y, 64, gen)
    loss = torch.nn.functional.cross_entropy(model(xb), yb)
    loss.backward(); opt.step(); opt.zero_grad()
    guard.step(loss)
guard.finish()
