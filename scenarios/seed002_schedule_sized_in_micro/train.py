"""Seed 002's other reading: num_training_steps counted in micro-batches (steps x 16) while the scheduler
is stepped once per optimizer step, so warmup and decay never finish."""
import torch

import trainguard
from trainguard.demo.toys import MLP, clusters, minibatch, warmup_linear

torch.manual_seed(0); torch.set_num_threads(1)
x, y = clusters()
gen = torch.Generator().manual_seed(0)
model = MLP()
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
steps, accum = 100, 16
micro_batches = steps * accum
sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_linear(num_warmup_steps=micro_batches // 10,
                                                             num_training_steps=micro_batches))  # the bug
guard = trainguard.watch(model, opt, sched, total_steps=steps, grad_accum=accum)
for micro in range(micro_batches):
    xb, yb = minibatch(x, y, 16, gen)
    loss = torch.nn.functional.cross_entropy(model(xb), yb) / accum
    loss.backward()
    guard.step(loss * accum)
    if (micro + 1) % accum == 0:
        opt.step(); sched.step(); opt.zero_grad()
guard.finish()
