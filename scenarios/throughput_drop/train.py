"""From step 500 each step decodes its batch on the training process: 50 ms more CPU work a step.

Stands for a DataLoader whose workers died and a synchronous fallback that decodes in the main process
(pytorch/pytorch#13246 and its kind: "training becomes much slower after some iterations"). The work is
the process's own, so its CPU time per step grows with the wall time: a warning, not the machine's load.
"""
import time

import torch

import trainguard
from trainguard.demo.toys import MLP, clusters, minibatch

torch.manual_seed(0); torch.set_num_threads(1)
x, y = clusters()
gen = torch.Generator().manual_seed(0)
model = MLP()
opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
steps = 1000


def decode(seconds: float) -> int:
    """Work on the CPU for `seconds` of this thread's own CPU time (a load burst elsewhere does not shorten it)."""
    end, n = time.thread_time() + seconds, 0
    while time.thread_time() < end:
        n += sum(range(200))
    return n


guard = trainguard.watch(model, opt, total_steps=steps)
for step in range(1, steps + 1):
    if step >= 500:
        decode(0.05)
    xb, yb = minibatch(x, y, 64, gen)
    loss = torch.nn.functional.cross_entropy(model(xb), yb)
    loss.backward(); opt.step(); opt.zero_grad()
    guard.step(loss)
    if step == 560:
        break  # enough to see it; the planned length stays 1000
guard.finish()
