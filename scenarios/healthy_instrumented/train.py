"""Healthy twin: a tiny transformer LM with the probe, evaluation and a results file. Must stay quiet."""
import json

import torch

import trainguard
from trainguard.demo.tinylm import TinyLM, batch, corpus, cosine_with_warmup

torch.manual_seed(0)
torch.set_num_threads(1)
gen = torch.Generator().manual_seed(0)
data = corpus()
model = TinyLM(dim=64, layers=1)
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
steps = 150
sched = cosine_with_warmup(opt, warmup=10, total=steps)
guard = trainguard.watch(model, opt, sched, total_steps=steps, grad_accum=1)
with guard.phase("train"):
    for step in range(1, steps + 1):
        x, y = batch(data, 8, model.ctx, gen)
        loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        opt.step(); sched.step(); opt.zero_grad()
        guard.step(loss)
        if guard.due("eval", every=50):
            with guard.phase("eval"), torch.no_grad():
                xv, yv = batch(data, 8, model.ctx, gen)
                val = torch.nn.functional.cross_entropy(model(xv).flatten(0, 1), yv.flatten())
            guard.eval(loss=val)
json.dump({"ok": True}, open("results.json", "w"))
guard.finish()
