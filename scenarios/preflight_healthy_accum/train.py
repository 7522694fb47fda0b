"""Healthy twin: accumulation 8 with the schedule sized and stepped in optimizer steps, bf16 autocast in
training and in evaluation alike. `trainguard preflight` must pass it with exit 0 and no warning."""
import json

import torch

import trainguard
from trainguard.demo.tinylm import cosine_with_warmup

torch.manual_seed(0)
torch.set_num_threads(1)
accum, total = 8, 500
model = torch.nn.Linear(16, 1)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
sched = cosine_with_warmup(opt, warmup=50, total=total)
guard = trainguard.watch(model, opt, sched, total_steps=total, grad_accum=accum)
with guard.phase("train"):
    for micro in range(1, total * accum + 1):
        x = torch.randn(8, 16)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = (model(x).float() - x.sum(1, keepdim=True)).pow(2).mean()
        (loss / accum).backward()
        guard.step(loss)
        if micro % accum == 0:
            opt.step(); sched.step(); opt.zero_grad()
        if guard.due("eval", every=100):
            with guard.phase("eval"), torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
                guard.eval(loss=(model(x).float() - x.sum(1, keepdim=True)).pow(2).mean())
json.dump({"done": True}, open("results.json", "w"))
guard.finish()
