"""Mixed-precision loop that clips the gradients before unscaling them (milesial/Pytorch-UNet#468,
Lightning-AI/pytorch-lightning#9599: "the loss converged very slow").

`clip_grad_norm_` sees the gradients still multiplied by the GradScaler's scale (65,536) and clips them to
max_norm 1.0; `scaler.step` then divides them by the scale: every update is 65,536x smaller than meant.
The GradScaler is not given to `trainguard.watch`: the probe finds it stepping the optimizer.
"""
import torch

import trainguard
from trainguard.demo.toys import MLP, clusters, minibatch

torch.manual_seed(0); torch.set_num_threads(1)
x, y = clusters()
gen = torch.Generator().manual_seed(0)
model = MLP()
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
scaler = torch.amp.GradScaler("cpu")
steps = 400
guard = trainguard.watch(model, opt, total_steps=steps)
for step in range(1, steps + 1):
    xb, yb = minibatch(x, y, 64, gen)
    loss = torch.nn.functional.cross_entropy(model(xb), yb)
    scaler.scale(loss).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)  # the bug: before scaler.unscale_(opt)
    scaler.step(opt); scaler.update(); opt.zero_grad()
    guard.step(loss)
    if step == 100:
        break  # enough to see it; the planned length stays 400
guard.finish()
