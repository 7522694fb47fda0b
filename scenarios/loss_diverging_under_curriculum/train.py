"""The same curriculum as quiet_curriculum_weight_ramp, but half-way a 'warm restart' sets the LR 300x too
high: the parts themselves climb. The weights explain only their own share of the total's rise."""
import torch

import trainguard
from trainguard.demo.toys import MLP, clusters, minibatch

torch.manual_seed(0); torch.set_num_threads(1)
x, y = clusters()
gen = torch.Generator().manual_seed(0)
model = MLP()
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
steps = 600
guard = trainguard.watch(model, opt, total_steps=steps)
for step in range(1, steps + 1):
    if step == 301:
        for g in opt.param_groups:
            g["lr"] = 3.0  # the bug: the restart's peak LR
    xb, yb = minibatch(x, y, 64, gen)
    h = model.body(xb)
    ce = torch.nn.functional.cross_entropy(model.head(h), yb)
    aux = ((h[:, :16] - 1.7 * torch.randn(64, 16, generator=gen)) ** 2).mean()
    w = {"ce": 1.0, "aux": 0.06 + 0.93 * step / steps}
    loss = w["ce"] * ce + w["aux"] * aux
    loss.backward(); opt.step(); opt.zero_grad()
    guard.step(loss, parts={"ce": ce, "aux": aux}, weights=w)
guard.finish()
