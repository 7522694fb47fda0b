"""Healthy twin of seed 002: gradient accumulation 16, the scheduler stepped once per optimizer step."""
import torch

import trainguard
from trainguard.demo.toys import MLP, clusters, minibatch, warmup_linear

torch.manual_seed(0); torch.set_num_threads(1)
x, y = clusters(); xv, yv = clusters(512, seed=1)
gen = torch.Generator().manual_seed(0)
model = MLP()
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
steps, accum = 120, 16
sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_linear(num_warmup_steps=12, num_training_steps=steps))
guard = trainguard.watch(model, opt, sched, total_steps=steps, grad_accum=accum)
for micro in range(steps * accum):
    xb, yb = minibatch(x, y, 32, gen)
    loss = torch.nn.functional.cross_entropy(model(xb), yb) / accum
    loss.backward()
    guard.step(loss * accum)
    if (micro + 1) % accum == 0:
        opt.step(); sched.step(); opt.zero_grad()
    if guard.due("eval", every=20):
        with torch.no_grad():
            guard.eval(loss=torch.nn.functional.cross_entropy(model(xv), yv))
guard.finish()
