"""Hang twin of quiet_torchrun_rank0_eval_barrier: rank 0 evaluates alone and then calls the barrier the
other ranks were meant to wait at, but the barrier sits inside `if rank == 0:` (one indent too many). Rank 1
goes on into the next step's backward, where DDP's gradient all-reduce waits for rank 0, which waits in
the barrier. A new user's DDP job over NCCL hung so (benchmarks/newuser_nccl); over NCCL the two hosts sit
inside backward and their devices in the all-reduces, over gloo rank 0's host waits in the barrier.

    trainguard run --stall-timeout 5 -- torchrun --nproc_per_node=2 train.py
"""
import datetime
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import trainguard

STEPS = 120
EVAL_EVERY = 40

dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=5))
rank = dist.get_rank()
torch.manual_seed(0)
torch.set_num_threads(1)
X = torch.randn(STEPS * 8 * 2, 16)
Y = (X[:, :4].sum(1) > 0).long()
train = TensorDataset(X, Y)
loader = DataLoader(train, batch_size=8, sampler=DistributedSampler(train, shuffle=True))
val_x = torch.randn(256, 16)
val_y = (val_x[:, :4].sum(1) > 0).long()
model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)))
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
guard = trainguard.watch(model, opt, total_steps=STEPS)


def evaluate() -> float:
    net = model.module
    net.eval()
    with torch.no_grad():
        correct = sum(int((net(val_x[i:i + 16]).argmax(1) == val_y[i:i + 16]).sum()) for i in range(0, 256, 16))
    net.train()
    time.sleep(1.0)  # the metric's own work on the host
    return correct / 256


for step, (x, y) in enumerate(loader, start=1):
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    guard.step(loss)
    if step % EVAL_EVERY == 0:
        if rank == 0:
            print(f"step {step} loss {loss.item():.4f} val acc {evaluate():.3f}", flush=True)
            dist.barrier()  # the planted bug: only rank 0 gets here
guard.finish()
dist.destroy_process_group()
