"""The backbone is frozen after warm-up, but AdamW keeps moving it (TG212 frozen-params-updated).

Modelled on the forum threads on layers that still change after `requires_grad = False` (e.g.
discuss.pytorch.org/t/153740 "Why there is still a small change in frozen layer parameters?", fixed by
setting `param.grad = None`): the gradients are zeroed, not set to None, so the frozen parameters keep
a (zero) gradient and AdamW's weight decay and momentum keep updating them.
"""
import torch
from torch import nn

import trainguard
from trainguard.demo.toys import MLP, clusters, minibatch

torch.manual_seed(0); torch.set_num_threads(1)
x, y = clusters()
gen = torch.Generator().manual_seed(0)
model = MLP()
opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.05)
steps, freeze_at = 80, 30
guard = trainguard.watch(model, opt, total_steps=steps)
for step in range(1, steps + 1):
    if step == freeze_at + 1:
        for p in model.body.parameters():
            p.requires_grad = False  # from here on only the head should learn
    xb, yb = minibatch(x, y, 64, gen)
    loss = nn.functional.cross_entropy(model(xb), yb)
    opt.zero_grad(set_to_none=False)  # the bug's other half: the frozen parameters keep a zeroed .grad
    loss.backward()
    opt.step()
    guard.step(loss)
guard.finish()
