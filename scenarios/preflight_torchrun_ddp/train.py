"""A DDP job under torchrun, the way people write one: a DistributedSampler, an evaluation whose loss is
all-reduced across ranks, a checkpoint saved by rank 0 only and resumed by every rank.

    trainguard preflight -- torchrun --nproc_per_node=2 train.py

Every rank must be fast-forwarded in lockstep: if rank 0's `guard.due("eval")` answered True while rank
1's answered False, rank 0 would wait alone in the evaluation's all-reduce; if rank 0 stopped a step
before rank 1, rank 1 would wait alone in the next step's gradient all-reduce.
"""
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import trainguard

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
torch.set_num_threads(1)
epochs = 3
data = TensorDataset(torch.randn(256, 16), torch.randn(256, 1))
sampler = DistributedSampler(data, shuffle=True, seed=0)
loader = DataLoader(data, batch_size=16, sampler=sampler)
total = epochs * len(loader)
model = DDP(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=total)
guard = trainguard.watch(model, opt, sched, total_steps=total)

start_epoch = 0
if guard.resume_from:  # every rank loads the checkpoint rank 0 saved
    state = torch.load(guard.resume_from)
    model.module.load_state_dict(state["model"]); opt.load_state_dict(state["opt"])
    sched.load_state_dict(state["sched"])
    start_epoch = state["epoch"] + 1

os.makedirs("checkpoints", exist_ok=True)
for epoch in range(start_epoch, epochs):
    sampler.set_epoch(epoch)
    for x, y in guard.batches(loader):
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step(); sched.step(); opt.zero_grad()
        guard.step(loss)
        if guard.due("eval", every=10):
            with torch.no_grad():
                val = torch.nn.functional.mse_loss(model(x), y)
            dist.all_reduce(val)  # every rank must be here, or the job hangs
            guard.eval(loss=val / dist.get_world_size())
        if guard.due("save", every=10):
            path = f"checkpoints/epoch{epoch}.pt"
            if rank == 0:
                torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(),
                            "sched": sched.state_dict(), "epoch": epoch}, path)
                guard.checkpoint_saved(path)
            dist.barrier()  # the others wait until the checkpoint is on disk
guard.finish()
dist.destroy_process_group()
