"""The labels are shuffled separately from the inputs (a broken collate): the loss cannot fall."""
import torch

import trainguard
from trainguard.demo.toys import MLP, clusters, minibatch

torch.manual_seed(0); torch.set_num_threads(1)
x, y = clusters()
gen = torch.Generator().manual_seed(0)
model = MLP()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
steps = 1000
guard = trainguard.watch(model, opt, total_steps=steps)
for step in range(1, steps + 1):
    xb, _ = minibatch(x, y, 64, gen)
    _, yb = minibatch(x, y, 64, gen)  # the bug: targets of another batch
    loss = torch.nn.functional.cross_entropy(model(xb), yb)
    loss.backward(); opt.step(); opt.zero_grad()
    guard.step(loss)
guard.finish()
