"""Healthy, quiet set, default settings: between epochs the loop waits 75 s for the next data shard, which
another job writes (here a helper process the loop asks for the shard when epoch 1 ends). Nothing is
marked while it waits, so the wait is longer than the default stall timeout (60 s: ten times the longest
gap between steps, at least 60 s). What it proves: the stall is reported (TG509 run-stalled, cause sleep,
where the loop polls) within the stall timeout + 15 s, the run is not stopped (a wait on a file is no proof
of a hang, and the limit of a phase the run has been through is 600 s at least), the finding turns to info
when the file comes ("slow, not hung"), and the run ends `completed`. Hang twin:
quietset_wait_for_file_never_comes.
"""
import os
import subprocess
import sys
import time

import torch

import trainguard

WAIT = 75.0  # seconds until shard 2 is ready: the default stall timeout (60 s) + 15 s, so the stall is seen

model = torch.nn.Linear(16, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
guard = trainguard.watch(model, opt, total_steps=40)
for epoch in (1, 2):
    if epoch == 2:
        # the "other job" that produces shard 2, asked for it now
        subprocess.Popen([sys.executable, "-c",
                          f"import time; time.sleep({WAIT}); open('shard-2.ready', 'w').close()"])
        while not os.path.exists("shard-2.ready"):  # the wait between epochs
            time.sleep(0.5)
    for _ in range(20):
        loss = model(torch.randn(8, 16)).pow(2).mean()
        loss.backward(); opt.step(); opt.zero_grad()
        guard.step(loss)
        time.sleep(0.02)
guard.finish()
