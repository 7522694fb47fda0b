"""Warmup + cosine (`SequentialLR`) whose cosine is sized for one epoch (`T_max=len(loader)`) in an
8-epoch run: CosineAnnealingLR is periodic, so the LR falls to zero, climbs back and falls again, four
times. The healthy twin (sched_cosine_once) sizes the cosine for the whole run."""
import sys

import torch

import trainguard
from trainguard.demo.toys import MLP, clusters

torch.manual_seed(0); torch.set_num_threads(1)
x, y = clusters(n=960)
# the batches of one epoch, made once: a DataLoader's per-item collate would outweigh this tiny model's
# step and make the run about its data wait, not its schedule
loader = list(zip(x.split(32), y.split(32)))
model = MLP()
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
epochs, warmup = 8, 5
steps = epochs * len(loader)
t_max = steps - warmup if "--whole-run" in sys.argv else len(loader)  # the bug: one epoch, not the run
warm = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.1, total_iters=warmup)
cosine = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=t_max)
sched = torch.optim.lr_scheduler.SequentialLR(opt, [warm, cosine], milestones=[warmup])
guard = trainguard.watch(model, opt, sched, total_steps=steps)
for epoch in range(epochs):
    for xb, yb in guard.batches(loader):
        loss = torch.nn.functional.cross_entropy(model(xb), yb)
        loss.backward(); opt.step(); sched.step(); opt.zero_grad()
        guard.step(loss)
guard.finish()
