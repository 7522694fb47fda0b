"""Healthy, quiet set: between epochs the loop waits for the next data shard, which another job writes
(here a helper process that takes 14 s). Nothing is marked while it waits: the stall is reported at the
stall timeout (4 s), the run is not stopped (a wait on a file is no proof of a hang), and it completes.
"""
import os
import subprocess
import sys
import time

import torch

import trainguard

model = torch.nn.Linear(16, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
guard = trainguard.watch(model, opt, total_steps=40)
# the "other job" that produces shard 2
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(14); open('shard-2.ready', 'w').close()"])
for epoch in (1, 2):
    if epoch == 2:
        while not os.path.exists("shard-2.ready"):  # the wait between epochs
            time.sleep(0.5)
    for _ in range(20):
        loss = model(torch.randn(8, 16)).pow(2).mean()
        loss.backward(); opt.step(); opt.zero_grad()
        guard.step(loss)
        time.sleep(0.02)
guard.finish()
