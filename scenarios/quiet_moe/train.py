"""Healthy twin of expert_collapse: unbiased router, balance loss in the total. Must stay quiet."""
import torch

import trainguard
from trainguard.demo.moe import TinyMoE
from trainguard.demo.toys import clusters, minibatch

torch.manual_seed(0); torch.set_num_threads(1)
x, y = clusters()
gen = torch.Generator().manual_seed(0)
model = TinyMoE()
opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
steps = 200
guard = trainguard.watch(model, opt, total_steps=steps)
for step in range(1, steps + 1):
    xb, yb = minibatch(x, y, 64, gen)
    ce = torch.nn.functional.cross_entropy(model(xb), yb)
    loss = ce + 0.05 * model.balance
    loss.backward(); opt.step(); opt.zero_grad()
    guard.step(loss, parts={"ce": ce, "balance": model.balance}, weights={"ce": 1.0, "balance": 0.05})
    guard.experts(model.load, layer=0)
guard.finish()
