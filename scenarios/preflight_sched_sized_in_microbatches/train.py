"""The mirror of seed 002: a cosine schedule sized in micro-batches (500 steps x accumulation 8) but
stepped once per optimizer step: the run ends with the schedule 1/8 done, its LR never decays."""
import torch

import trainguard
from trainguard.demo.tinylm import cosine_with_warmup

torch.manual_seed(0)
torch.set_num_threads(1)
accum, total = 8, 500
model = torch.nn.Linear(16, 1)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
sched = cosine_with_warmup(opt, warmup=400, total=total * accum)  # the bug: sized in micro-batches
guard = trainguard.watch(model, opt, sched, total_steps=total, grad_accum=accum)
with guard.phase("train"):
    for micro in range(1, total * accum + 1):
        x = torch.randn(8, 16)
        loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
        (loss / accum).backward()
        guard.step(loss)
        if micro % accum == 0:
            opt.step(); sched.step(); opt.zero_grad()
guard.finish()
