"""Healthy twin of the seed 004 scenarios: parts of one order, a curriculum that ramps in over 20%. Quiet."""
import torch

import trainguard
from trainguard.demo.toys import MLP, clusters, minibatch

torch.manual_seed(0); torch.set_num_threads(1)
x, y = clusters()
gen = torch.Generator().manual_seed(0)
model = MLP()
opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
steps = 400
guard = trainguard.watch(model, opt, total_steps=steps)
for step in range(1, steps + 1):
    xb, yb = minibatch(x, y, 64, gen)
    h = model.body(xb)
    logits = model.head(h)
    ce = torch.nn.functional.cross_entropy(logits, yb)
    t = torch.nn.functional.one_hot(yb, 10) * 0.8 + 0.02  # soft targets, as a teacher would give
    kd = torch.nn.functional.kl_div(torch.log_softmax(logits / 2, -1), t, reduction="batchmean")
    feature = 0.1 * (h ** 2).mean()
    w = {"ce": 1.0, "kd": 0.5, "feature": 0.5 * min(1.0, step / (0.2 * steps))}
    parts = {"ce": ce, "kd": kd, "feature": feature}
    loss = sum(w[k] * v for k, v in parts.items())
    loss.backward(); opt.step(); opt.zero_grad()
    guard.step(loss, parts=parts, weights=w)
guard.finish()
