"""The router starts biased towards expert 0 and the balance loss is computed but left out of the total."""
import torch

import trainguard
from trainguard.demo.moe import TinyMoE
from trainguard.demo.toys import clusters, minibatch

torch.manual_seed(0); torch.set_num_threads(1)
x, y = clusters()
gen = torch.Generator().manual_seed(0)
model = TinyMoE()
with torch.no_grad():
    model.router.bias[0] = 4.0
opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
steps = 200
guard = trainguard.watch(model, opt, total_steps=steps)
for step in range(1, steps + 1):
    xb, yb = minibatch(x, y, 64, gen)
    ce = torch.nn.functional.cross_entropy(model(xb), yb)
    loss = ce  # the bug: + 0.01 * model.balance was dropped
    loss.backward(); opt.step(); opt.zero_grad()
    guard.step(loss)
    guard.experts(model.load, layer=0)
guard.finish()
