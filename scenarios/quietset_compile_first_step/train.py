"""Healthy, quiet set: the first step starts with a long compilation (here a stand-in that burns CPU for
14 s in one place, as an inductor/XLA compile does, without a forward or a print). Start-up lasts until
the first optimizer step: the stall is reported at the stall timeout (4 s) but nothing in start-up is
judged by a pace the run has not shown yet, so it is not stopped and the run completes.
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
compiled = None
for step in range(1, 31):
    if compiled is None:
        compiled = compile_model(model, seconds=14.0)  # the first step's compilation
    loss = compiled(torch.randn(8, 16)).pow(2).mean()
    loss.backward(); opt.step(); opt.zero_grad()
    guard.step(loss)
guard.finish()
