"""A small DDP job over two simulated nodes: gloo on the CPU, a sleep per step so four ranks on a shared
two-core machine stay cheap. The zoo's nodes mode starts it on each node as

    trainguard run --run-dir RUN -- torchrun --nnodes=2 --node_rank=N --nproc_per_node=2 \
        --rdzv-backend=c10d --rdzv-endpoint=127.0.0.1:PORT train.py STEPS
"""
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import trainguard

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 30
dist.init_process_group("gloo")
torch.manual_seed(0)
torch.set_num_threads(1)
model = DDP(torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
guard = trainguard.watch(model, opt, total_steps=steps)
for _ in range(steps):
    x = torch.randn(16, 8)
    loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    guard.step(loss)
    time.sleep(0.2)
guard.finish()
dist.destroy_process_group()
