"""Seed 004's curriculum: the LM weight ramps 0 -> 1 over a horizon counted in micro-batches (7.5x the run)."""
import torch

import trainguard
from trainguard.demo.toys import MLP, clusters, minibatch

torch.manual_seed(0); torch.set_num_threads(1)
x, y = clusters()
gen = torch.Generator().manual_seed(0)
model = MLP()
opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
steps = 400
ramp = steps * 15 // 2  # the bug: the ramp was sized in micro-batches
guard = trainguard.watch(model, opt, total_steps=steps)
for step in range(1, steps + 1):
    xb, yb = minibatch(x, y, 64, gen)
    logits = model(xb)
    kd = torch.nn.functional.cross_entropy(logits, yb)
    lm = torch.nn.functional.cross_entropy(logits * 0.8, yb)
    w_lm = min(1.0, step / ramp)
    loss = kd + w_lm * lm
    loss.backward(); opt.step(); opt.zero_grad()
    guard.step(loss, parts={"kd": kd, "lm": lm}, weights={"kd": 1.0, "lm": w_lm})
guard.finish()
