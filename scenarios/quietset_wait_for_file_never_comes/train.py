"""Hang twin of quietset_wait_for_file, default stall timeout: the job that was to write the next shard
died, so the file never comes. What it proves: the same wait, with no end, is found at the default stall
timeout (60 s) within 15 s (TG509 run-stalled, cause sleep, where the loop polls), and, since a polling
sleep is no proof (the file might still come), the run is stopped only when the stall outlasts its limit:
here `--hang-limit 90` (without it, the limit of a phase the run has been through: 600 s at least).
"""
import os
import time

import torch

import trainguard

model = torch.nn.Linear(16, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
guard = trainguard.watch(model, opt, total_steps=40)
for epoch in (1, 2):
    if epoch == 2:
        while not os.path.exists("shard-2.ready"):  # the planted hang: nobody writes it
            time.sleep(0.5)
    for _ in range(20):
        loss = model(torch.randn(8, 16)).pow(2).mean()
        loss.backward(); opt.step(); opt.zero_grad()
        guard.step(loss)
        time.sleep(0.02)
guard.finish()
