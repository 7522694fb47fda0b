"""Healthy: a linear warmup then StepLR-style decays at 50% and 75% of the run. Must stay quiet."""
import torch

import trainguard
from trainguard.demo.toys import MLP, clusters, minibatch

torch.manual_seed(0); torch.set_num_threads(1)
x, y = clusters()
gen = torch.Generator().manual_seed(0)
model = MLP()
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
steps = 300
sched = torch.optim.lr_scheduler.SequentialLR(opt, [
    torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.1, total_iters=20),
    torch.optim.lr_scheduler.MultiStepLR(opt, milestones=[130, 205], gamma=0.1),
], milestones=[20])
guard = trainguard.watch(model, opt, sched, total_steps=steps)
for step in range(1, steps + 1):
    xb, yb = minibatch(x, y, 64, gen)
    loss = torch.nn.functional.cross_entropy(model(xb), yb)
    loss.backward(); opt.step(); sched.step(); opt.zero_grad()
    guard.step(loss)
guard.finish()
