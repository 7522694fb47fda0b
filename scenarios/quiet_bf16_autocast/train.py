"""Healthy: forward under CPU bf16 autocast. Must stay quiet."""
import torch

import trainguard
from trainguard.demo.toys import MLP, clusters, minibatch, warmup_cosine

torch.manual_seed(0); torch.set_num_threads(1)
x, y = clusters()
gen = torch.Generator().manual_seed(0)
model = MLP()
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
steps = 300
sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(num_warmup_steps=30, num_training_steps=steps, floor=0.1))
guard = trainguard.watch(model, opt, sched, total_steps=steps)
for step in range(1, steps + 1):
    xb, yb = minibatch(x, y, 64, gen)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = torch.nn.functional.cross_entropy(model(xb), yb)
    loss.backward(); opt.step(); sched.step(); opt.zero_grad()
    guard.step(loss)
guard.finish()
