"""Healthy twin of lr_too_high_diverges: the same tiny LM at an LR of 0.1, high for AdamW (the first update
changes the weights by 0.16 of their norm, 100x the typical 1e-3) but the loss falls from its first step on.
A large update alone is no divergence: nothing may be reported."""
import torch

import trainguard
from trainguard.demo.tinylm import TinyLM, batch, corpus

torch.manual_seed(0); torch.set_num_threads(1)
gen = torch.Generator().manual_seed(0)
data = corpus(40)
model = TinyLM(dim=32, layers=1, heads=2, ctx=32)
opt = torch.optim.AdamW(model.parameters(), lr=0.1)  # high, and the loss falls all the same
steps = 300
guard = trainguard.watch(model, opt, total_steps=steps)
for step in range(1, steps + 1):
    xb, yb = batch(data, 8, model.ctx, gen)
    loss = torch.nn.functional.cross_entropy(model(xb).flatten(0, 1), yb.flatten())
    loss.backward(); opt.step(); opt.zero_grad()
    guard.step(loss)
    if step % 20 == 0:
        print(f"step {step} loss {loss.item():.2f}", flush=True)
    if step == 120:
        break  # enough to see it; the planned length stays 300
guard.finish()
