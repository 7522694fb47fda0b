"""Half-way, a 'warm restart' sets the LR to 300x its value: the loss turns round and climbs."""
import torch

import trainguard
from trainguard.demo.toys import MLP, clusters, minibatch

torch.manual_seed(0); torch.set_num_threads(1)
x, y = clusters(spread=2.0)
gen = torch.Generator().manual_seed(0)
model = MLP()
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
steps = 1000
guard = trainguard.watch(model, opt, total_steps=steps)
for step in range(1, steps + 1):
    if step == 501:
        for g in opt.param_groups:
            g["lr"] = 3.0  # the bug: the restart's peak LR
    xb, yb = minibatch(x, y, 64, gen)
    loss = torch.nn.functional.cross_entropy(model(xb), yb)
    loss.backward(); opt.step(); opt.zero_grad()
    guard.step(loss)
guard.finish()
