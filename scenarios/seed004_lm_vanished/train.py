"""Seed 004: the LM loss is added under a condition that only step 1 meets, then vanishes."""
import torch

import trainguard
from trainguard.demo.toys import MLP, clusters, minibatch

torch.manual_seed(0); torch.set_num_threads(1)
x, y = clusters()
gen = torch.Generator().manual_seed(0)
model = MLP()
opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
steps = 200
guard = trainguard.watch(model, opt, total_steps=steps)
last_logged = 0
for step in range(1, steps + 1):
    xb, yb = minibatch(x, y, 64, gen)
    logits = model(xb)
    kd = torch.nn.functional.cross_entropy(logits, yb)
    parts = {"kd": kd}
    if step - last_logged >= steps or step == 1:  # the bug: meant "every log interval"
        parts["lm"] = torch.nn.functional.cross_entropy(logits * 0.5, yb)
        last_logged = step
    loss = sum(parts.values())
    loss.backward(); opt.step(); opt.zero_grad()
    guard.step(loss, parts=parts)
guard.finish()
