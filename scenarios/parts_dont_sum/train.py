"""The weights passed to the guard say feature x 0.1, but the total adds the feature loss at full weight."""
import torch

import trainguard
from trainguard.demo.toys import MLP, clusters, minibatch

torch.manual_seed(0); torch.set_num_threads(1)
x, y = clusters()
gen = torch.Generator().manual_seed(0)
model = MLP()
opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
w = {"ce": 1.0, "feature": 0.1}
steps = 200
guard = trainguard.watch(model, opt, total_steps=steps)
for step in range(1, steps + 1):
    xb, yb = minibatch(x, y, 64, gen)
    h = model.body(xb)
    ce = torch.nn.functional.cross_entropy(model.head(h), yb)
    feature = (h ** 2).mean()
    loss = ce + feature  # the bug: w["feature"] forgotten
    loss.backward(); opt.step(); opt.zero_grad()
    guard.step(loss, parts={"ce": ce, "feature": feature}, weights=w)
guard.finish()
