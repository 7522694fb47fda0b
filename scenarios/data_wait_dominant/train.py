"""Each batch takes 10 ms to produce in the training process: the loop waits for data most of the time."""
import time

import torch

import trainguard
from trainguard.demo.toys import MLP, clusters, minibatch

torch.manual_seed(0); torch.set_num_threads(1)
x, y = clusters()
gen = torch.Generator().manual_seed(0)


def slow_loader(n):
    for _ in range(n):
        time.sleep(0.01)  # decoding, augmenting, tokenising on the spot
        yield minibatch(x, y, 64, gen)


model = MLP()
opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
steps = 400
guard = trainguard.watch(model, opt, total_steps=steps)
for step, (xb, yb) in enumerate(guard.batches(slow_loader(60)), 1):
    loss = torch.nn.functional.cross_entropy(model(xb), yb)
    loss.backward(); opt.step(); opt.zero_grad()
    guard.step(loss)
guard.finish()
