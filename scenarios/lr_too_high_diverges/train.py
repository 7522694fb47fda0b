"""A tiny character LM trained with an LR meant as 2.5e-4 but typed as 2 (OpenNMT/OpenNMT-tf#744: "The learning
rate you set in the configuration is too large ... the default is 2.5e-4 but you then set 2").

The loss never goes NaN: it jumps to hundreds of times the loss of a uniform guess and stays there, while
each step changes the weights by more than their own size. Nothing but the numbers says it.
"""
import torch

import trainguard
from trainguard.demo.tinylm import TinyLM, batch, corpus

torch.manual_seed(0); torch.set_num_threads(1)
gen = torch.Generator().manual_seed(0)
data = corpus(40)
model = TinyLM(dim=32, layers=1, heads=2, ctx=32)
opt = torch.optim.AdamW(model.parameters(), lr=2.0)  # the bug: 2 where 2.5e-4 was meant
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
