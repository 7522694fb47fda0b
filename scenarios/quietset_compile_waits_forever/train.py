"""Hang twin of quietset_compile_first_step: the first step's compilation hands its work to a compile
worker thread and waits for its "done" event, but the worker died on an exception (a thread's exception
only prints). Nothing can set the event: that is proof, even in start-up, and the run is stopped at once.
"""
import threading

import torch

import trainguard

done = threading.Event()


def compile_worker() -> None:
    graph = None
    graph.lower()  # AttributeError: the worker dies before `done.set()`
    done.set()


model = torch.nn.Linear(16, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
guard = trainguard.watch(model, opt, total_steps=30)
for step in range(1, 31):
    if step == 1:
        threading.Thread(target=compile_worker, name="compile-worker", daemon=True).start()
        done.wait()  # the planted hang
    loss = model(torch.randn(8, 16)).pow(2).mean()
    loss.backward(); opt.step(); opt.zero_grad()
    guard.step(loss)
guard.finish()
