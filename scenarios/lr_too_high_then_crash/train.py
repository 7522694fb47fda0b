"""The LR typed as 2 for 2.5e-4 (OpenNMT/OpenNMT-tf#744), in a loop that stops itself once the loss passes a
bound: `RuntimeError: Model diverged with loss = ...`, the message OpenNMT-tf raises. The crash is the
consequence; its finding must name the divergence before it and the LR, not only "read the exception".
"""
import time

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
above = 0
for step in range(1, steps + 1):
    xb, yb = batch(data, 8, model.ctx, gen)
    loss = torch.nn.functional.cross_entropy(model(xb).flatten(0, 1), yb.flatten())
    loss.backward(); opt.step(); opt.zero_grad()
    guard.step(loss)
    time.sleep(0.05)  # stands for a slower real step
    above = above + 1 if loss.item() > 50 else 0
    if above >= 40:  # the script's own divergence check, after 40 steps above its bound
        raise RuntimeError(f"Model diverged with loss = {loss.item():.1f}")
guard.finish()
