"""reduction="sum": the loss is 64 times what a mean over the batch would be (147 where ln 10 = 2.3)."""
import torch

import trainguard
from trainguard.demo.toys import MLP, clusters, minibatch

torch.manual_seed(0); torch.set_num_threads(1)
x, y = clusters()
gen = torch.Generator().manual_seed(0)
model = MLP()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
steps = 200
guard = trainguard.watch(model, opt, total_steps=steps)
for step in range(1, steps + 1):
    xb, yb = minibatch(x, y, 64, gen)
    loss = torch.nn.functional.cross_entropy(model(xb), yb, reduction="sum")  # the bug
    loss.backward(); opt.step(); opt.zero_grad()
    guard.step(loss)
guard.finish()
