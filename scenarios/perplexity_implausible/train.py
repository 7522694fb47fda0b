"""Perplexity reported as exp(total loss), the feature term included: a number in the hundreds of millions."""
import math

import torch

import trainguard
from trainguard.demo.tinylm import TinyLM, batch, corpus

torch.manual_seed(0); torch.set_num_threads(1)
gen = torch.Generator().manual_seed(0)
data = corpus(40)
model = TinyLM(dim=32, layers=1, heads=2, ctx=32)
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
steps = 75
guard = trainguard.watch(model, opt, total_steps=steps)
for step in range(1, steps + 1):
    xb, yb = batch(data, 8, model.ctx, gen)
    loss = torch.nn.functional.cross_entropy(model(xb).flatten(0, 1), yb.flatten())
    loss.backward(); opt.step(); opt.zero_grad()
    guard.step(loss)
    if guard.due("eval", every=25):
        with torch.no_grad():
            xv, yv = batch(data, 8, model.ctx, gen)
            lm = torch.nn.functional.cross_entropy(model(xv).flatten(0, 1), yv.flatten()).item()
        total = lm + 17.0  # the feature-matching term of the distillation total
        guard.eval(lm_loss=lm, perplexity=math.exp(total))  # the bug: exp of the total
guard.finish()
