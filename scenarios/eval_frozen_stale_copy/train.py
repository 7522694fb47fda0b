"""Evaluation uses a copy made before training (an EMA that is never updated): its results never change."""
import copy

import torch

import trainguard
from trainguard.demo.toys import MLP, clusters, minibatch

torch.manual_seed(0); torch.set_num_threads(1)
x, y = clusters(); xv, yv = clusters(512, seed=1)
gen = torch.Generator().manual_seed(0)
model = MLP()
ema = copy.deepcopy(model)  # the bug: never updated
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
steps = 150
guard = trainguard.watch(model, opt, total_steps=steps)
for step in range(1, steps + 1):
    xb, yb = minibatch(x, y, 64, gen)
    loss = torch.nn.functional.cross_entropy(model(xb), yb)
    loss.backward(); opt.step(); opt.zero_grad()
    guard.step(loss)
    if guard.due("eval", every=25):
        with torch.no_grad():
            logits = ema(xv)
        guard.eval(loss=torch.nn.functional.cross_entropy(logits, yv), accuracy=(logits.argmax(1) == yv).float().mean())
guard.finish()
