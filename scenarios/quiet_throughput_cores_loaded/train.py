"""Healthy run while other processes load every core: from step 150 to step 260, one busy process a core.

Modelled on issue 31 (item 8): 12 healthy runs on a shared machine gave 3 `throughput-drop` warnings whose
own evidence said the machine was loaded (wall time per step x33, the process's CPU time per step x1.4).
Unlike quiet_throughput_shared_machine nothing is pinned: torch keeps its own intra-op threads, so the
training thread mostly waits for them in a futex, not in the run queue, and its own run-queue wait does not
explain the slowdown; the process's CPU time per step (every thread) does not grow with it. The load is
bounded: the busy processes are killed at step 260 (a few seconds) or when the script ends.
"""
import os
import subprocess
import sys

import torch

import trainguard
from trainguard.demo.toys import MLP, clusters, minibatch

torch.manual_seed(0)
x, y = clusters()
gen = torch.Generator().manual_seed(0)
model = MLP(hidden=256)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
steps = 300
burners: list[subprocess.Popen] = []
guard = trainguard.watch(model, opt, total_steps=steps)
try:
    for step in range(1, steps + 1):
        if step == 150:  # other jobs land on the machine: a busy process a core
            burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                       for _ in range(os.cpu_count() or 1)]
        if step == 260:
            for p in burners:
                p.kill()
                p.wait()
            burners = []
        xb, yb = minibatch(x, y, 256, gen)
        loss = torch.nn.functional.cross_entropy(model(xb), yb)
        loss.backward(); opt.step(); opt.zero_grad()
        guard.step(loss)
finally:
    for p in burners:
        p.kill()
        p.wait()
guard.finish()
