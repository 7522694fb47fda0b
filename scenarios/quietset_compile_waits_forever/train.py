"""Hang twin of quietset_compile_first_step: after the same banner, the first step's compilation hands its
work to a compile worker thread and waits for its "done" event, but the worker died on an exception (a
thread's exception only prints). What it proves: nothing can set the event, and that is proof even in
start-up, so the run is stopped at the first look. With default settings the first look comes at the
start-up stall timeout (300 s); to keep CI short this scenario fixes `--stall-timeout 4` (the figure at
default settings is in the README's quiet-set section).
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
print("compiling the model... (takes a ~minute)", flush=True)
for step in range(1, 31):
    if step == 1:
        threading.Thread(target=compile_worker, name="compile-worker", daemon=True).start()
        done.wait()  # the planted hang
    loss = model(torch.randn(8, 16)).pow(2).mean()
    loss.backward(); opt.step(); opt.zero_grad()
    guard.step(loss)
guard.finish()
