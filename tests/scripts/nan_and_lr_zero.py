"""A run with two planted faults, for the sinks' test: a corrupt sample makes the loss NaN at step 30,
and a linear decay sized for half the run leaves the LR at 0 from step 60 of 120."""
import torch

import trainguard
from trainguard.demo.toys import MLP, clusters, minibatch, warmup_linear

torch.manual_seed(0)
torch.set_num_threads(1)
x, y = clusters()
gen = torch.Generator().manual_seed(0)
steps = 120
model = MLP()
opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_linear(num_warmup_steps=5, num_training_steps=steps // 2))
guard = trainguard.watch(model, opt, sched, total_steps=steps)
for step in range(1, steps + 1):
    xb, yb = minibatch(x, y, 64, gen)
    if step == 30:
        xb[3, 5] = float("inf")
    loss = torch.nn.functional.cross_entropy(model(xb), yb)
    guard.step(loss)
    if torch.isfinite(loss):
        loss.backward()
        opt.step()
    opt.zero_grad()
    sched.step()
guard.finish()
