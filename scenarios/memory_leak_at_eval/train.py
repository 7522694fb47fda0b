"""Memory that grows only at evaluations: each keeps its outputs in a list that nothing clears.

Modelled on Lightning-AI/pytorch-lightning#8453 ("evaluation_loop memory leak": what `validation_step`
returned was stored across evaluations). Here the evaluation appends its outputs (48 MiB an evaluation)
to a list that lives on; training itself holds its memory flat. An evaluation every 20 steps, 120 planned.
"""
import torch

import trainguard
from trainguard.demo.toys import MLP, clusters, minibatch

torch.manual_seed(0); torch.set_num_threads(1)
x, y = clusters()
gen = torch.Generator().manual_seed(0)
model = MLP()
opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
steps = 2400
kept = []  # the bug: every evaluation's outputs, never cleared
guard = trainguard.watch(model, opt, total_steps=steps)
for step in range(1, steps + 1):
    xb, yb = minibatch(x, y, 64, gen)
    loss = torch.nn.functional.cross_entropy(model(xb), yb)
    loss.backward(); opt.step(); opt.zero_grad()
    guard.step(loss)
    if step % 20 == 0:
        with guard.phase("eval"), torch.no_grad():
            model.eval()
            outputs = [torch.randn(512, 1024) * 0 + model(xb).mean() for _ in range(24)]  # 48 MiB of outputs
            acc = (model(x[:512]).argmax(1) == y[:512]).float().mean().item()
            kept.append(outputs)
            model.train()
        guard.eval(accuracy=acc)
    if step == 200:
        break  # enough to see it; the planned length stays 2,400
guard.finish()
