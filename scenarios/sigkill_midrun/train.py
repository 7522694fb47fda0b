"""A run killed by SIGKILL mid-run (as the OOM killer would): no traceback, no goodbye."""
import os
import signal

import torch

import trainguard

model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
guard = trainguard.watch(model, opt, total_steps=10_000)
with guard.phase("train"):
    for step in range(1, 10_001):
        loss = model(torch.randn(16, 8)).pow(2).mean()
        loss.backward(); opt.step(); opt.zero_grad()
        guard.step(loss)
        if step == 300:
            os.kill(os.getpid(), signal.SIGKILL)
guard.finish()
