"""Healthy twin for preflight: a tiny LM over a DataLoader for 3 epochs, with evaluation, checkpoints that
resume, and a results file. `trainguard preflight` must pass it with exit 0 and no warning."""
import json
import math
import os

import torch

import trainguard
from trainguard.demo.tinylm import TinyLM, corpus, cosine_with_warmup

torch.manual_seed(0)
torch.set_num_threads(1)
ctx, epochs, accum = 32, 3, 2
data = corpus(40)
windows = torch.stack([data[i:i + ctx + 1] for i in range(0, len(data) - ctx - 1, ctx)])
loader = torch.utils.data.DataLoader(windows, batch_size=8, shuffle=True, num_workers=1, persistent_workers=True,
                                     drop_last=True)
total = epochs * (len(loader) // accum)
model = TinyLM(dim=32, layers=1, ctx=ctx)
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
sched = cosine_with_warmup(opt, warmup=10, total=total)
guard = trainguard.watch(model, opt, sched, total_steps=total, grad_accum=accum)

start_epoch = 0
if guard.resume_from:  # the script's own resume code: preflight runs it from the checkpoint it saved
    state = torch.load(guard.resume_from)
    model.load_state_dict(state["model"]); opt.load_state_dict(state["opt"]); sched.load_state_dict(state["sched"])
    start_epoch = state["epoch"]

os.makedirs("checkpoints", exist_ok=True)
with guard.phase("train"):
    for epoch in range(start_epoch, epochs):
        for i, w in enumerate(guard.batches(loader)):
            x, y = w[:, :-1], w[:, 1:]
            loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
            (loss / accum).backward()
            guard.step(loss)
            if (i + 1) % accum == 0:
                opt.step(); sched.step(); opt.zero_grad()
            if guard.due("eval", every=10):
                with guard.phase("eval"), torch.no_grad():
                    val = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
                guard.eval(loss=val, ppl=math.exp(val.item()))
            if guard.due("save", every=20):
                path = f"checkpoints/step{guard.step_count}.pt"
                torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict(),
                            "epoch": epoch}, path)
                guard.checkpoint_saved(path)
json.dump({"loss": loss.item()}, open("results.json", "w"))
guard.finish()
