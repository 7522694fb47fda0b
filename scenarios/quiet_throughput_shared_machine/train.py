"""Healthy run on a shared machine: at step 150 three other processes start burning the one CPU it runs on.

Its steps take 4x longer, but the run's own CPU time per step does not change: the slowdown is the
machine's (reported as info), not the run's. The CPU is shared on purpose with sched_setaffinity, so the
contention is real whatever the machine's size.
"""
import os
import subprocess
import sys

import torch

import trainguard
from trainguard.demo.toys import MLP, clusters, minibatch

cpu = sorted(os.sched_getaffinity(0))[0]
os.sched_setaffinity(0, {cpu})
torch.manual_seed(0); torch.set_num_threads(1)
x, y = clusters()
gen = torch.Generator().manual_seed(0)
model = MLP(hidden=384)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
steps = 300
burners = []
guard = trainguard.watch(model, opt, total_steps=steps)
try:
    for step in range(1, steps + 1):
        if step == 150:  # other jobs land on the same core
            burners = [subprocess.Popen([sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"])
                       for _ in range(3)]
        xb, yb = minibatch(x, y, 512, gen)
        loss = torch.nn.functional.cross_entropy(model(xb), yb)
        loss.backward(); opt.step(); opt.zero_grad()
        guard.step(loss)
finally:
    for p in burners:
        p.kill()
        p.wait()
guard.finish()
