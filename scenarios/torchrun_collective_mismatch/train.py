"""Two gloo ranks under torchrun; rank 1 calls a broadcast where rank 0 calls an all-reduce (step 12).

A rank-dependent branch, the way it happens in real scripts: rank 1 refreshes a value from rank 0 with a
broadcast while rank 0 goes on to all-reduce its loss for logging. From then on the ranks sit in
different collectives and neither can finish (gloo's default timeout is 30 minutes).

    trainguard run --stall-timeout 5 -- torchrun --nproc_per_node=2 train.py
"""
import datetime
import sys

import torch
import torch.distributed as dist

import trainguard

STEPS = 30
BAD_STEP = 12  # the planted bug: at this step rank 1 broadcasts instead of all-reducing

dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=10))
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
guard = trainguard.watch(model, opt, total_steps=STEPS)
for step in range(1, STEPS + 1):
    loss = model(torch.randn(16, 8)).pow(2).mean()
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()
    opt.step()
    opt.zero_grad()
    guard.step(loss)
    logged = loss.detach().clone()
    if rank == 1 and step == BAD_STEP and "--healthy" not in sys.argv:
        dist.broadcast(logged, src=0)
    else:
        dist.all_reduce(logged)
guard.finish()
dist.destroy_process_group()
