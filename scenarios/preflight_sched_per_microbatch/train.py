"""Seed 002's scheduler mistake: a linear warmup/decay schedule sized for the 500 optimizer steps, but
stepped once per micro-batch with gradient accumulation 8: it is over after 63 steps, LR zero after."""
import torch

import trainguard

torch.manual_seed(0)
torch.set_num_threads(1)
accum, total = 8, 500
model = torch.nn.Linear(16, 1)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
warmup = total // 10
sched = torch.optim.lr_scheduler.LambdaLR(
    opt, lambda s: s / warmup if s < warmup else max(0.0, (total - s) / (total - warmup)))
guard = trainguard.watch(model, opt, sched, total_steps=total, grad_accum=accum)
with guard.phase("train"):
    for micro in range(1, total * accum + 1):
        x = torch.randn(8, 16)
        loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
        (loss / accum).backward()
        guard.step(loss)
        if micro % accum == 0:
            opt.step(); opt.zero_grad()
        sched.step()  # the bug: once per micro-batch
guard.finish()
