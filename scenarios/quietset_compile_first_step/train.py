"""Healthy, quiet set, default settings: the script prints nanoGPT's "compiling the model... (takes a
~minute)" and the first step then waits 70 s for the compilation (a stand-in that burns CPU in one place,
as inductor does on a first call, with no forward finished, no print, no step). A printed line used to end
the start-up grace, so the run was stopped 60 s into the compilation. What it proves: start-up lasts until
the first optimizer step whatever is printed before it, so a 70 s compilation, longer than the stall timeout
after start-up (60 s), is neither reported nor stopped (the start-up stall timeout is 300 s) and the run
ends `completed`, quiet. Hang twin: quietset_compile_waits_forever.
"""
import time

import torch

import trainguard


def compile_model(model: torch.nn.Module, seconds: float) -> torch.nn.Module:
    """A stand-in for `torch.compile`'s first-call compilation: CPU-bound graph work, nothing printed."""
    t0, table = time.time(), {}
    while time.time() - t0 < seconds:
        table[len(table) % 4096] = sum(range(200))
    return model


model = torch.nn.Linear(16, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
guard = trainguard.watch(model, opt, total_steps=30)
print("compiling the model... (takes a ~minute)", flush=True)
compiled = None
for step in range(1, 31):
    if compiled is None:
        compiled = compile_model(model, seconds=70.0)  # the first step's compilation
    loss = compiled(torch.randn(8, 16)).pow(2).mean()
    loss.backward(); opt.step(); opt.zero_grad()
    guard.step(loss)
guard.finish()
