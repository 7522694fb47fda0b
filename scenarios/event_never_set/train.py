"""A wait on an event that is never set: the loop waits for a prefetch thread's "ready" signal, but the
thread died on its first item (an exception in a thread only prints; nobody sets the event).
"""
import threading

import torch

import trainguard

ready = threading.Event()


def prefetch() -> None:
    shard = None
    shard.load()  # AttributeError: the thread dies here, before `ready.set()`
    ready.set()


model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
guard = trainguard.watch(model, opt, total_steps=100)
for step in range(1, 101):
    loss = model(torch.randn(16, 8)).pow(2).mean()
    loss.backward(); opt.step(); opt.zero_grad()
    guard.step(loss)
    if step == 40:
        threading.Thread(target=prefetch, name="prefetch", daemon=True).start()
        ready.wait()  # the planted hang: nothing will ever set it
guard.finish()
