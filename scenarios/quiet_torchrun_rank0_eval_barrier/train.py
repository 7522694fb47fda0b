"""DDP the way most scripts evaluate: rank 0 alone runs the validation pass (and saves), the other ranks
wait for it at a barrier, then every rank trains on in step. Healthy.

    trainguard run -- torchrun --nproc_per_node=2 train.py

Rank 1 writes nothing while rank 0 evaluates (8 s, longer than TG705's 5 s floor): nothing stopped, so
quiet. Over NCCL a new user's run of this shape was told "rank 1 stopped at step 999" at error level: on a
GPU rank 1's rows after the barrier reached the store a few steps after rank 0's (their values are copied
from the device first). Here, on the CPU, they do not lag that much, and the rule before the fix was quiet
too; the store order that made it fire is held by tests/test_ranks.py
(test_a_rank_waiting_at_a_barrier_while_rank_0_evaluates_has_not_stopped).
"""
import datetime
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import trainguard

STEPS = 300
EVAL_EVERY = 100

dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=5))
rank = dist.get_rank()
torch.manual_seed(0)
torch.set_num_threads(1)
X = torch.randn(STEPS * 8 * 2, 16)
Y = (X[:, :4].sum(1) > 0).long()
train = TensorDataset(X, Y)
loader = DataLoader(train, batch_size=8, sampler=DistributedSampler(train, shuffle=True))
val_x = torch.randn(512, 16)
val_y = (val_x[:, :4].sum(1) > 0).long()
model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)))
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
guard = trainguard.watch(model, opt, total_steps=STEPS)


def evaluate() -> float:
    """Rank 0's validation pass: a slow metric over many small batches (8 s in all)."""
    net = model.module
    net.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, 512, 16):
            correct += int((net(val_x[i:i + 16]).argmax(1) == val_y[i:i + 16]).sum())
            time.sleep(0.25)  # the metric's own work on the host
    net.train()
    return correct / 512


for step, (x, y) in enumerate(loader, start=1):
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    guard.step(loss)
    if step % EVAL_EVERY == 0:
        if rank == 0:
            print(f"step {step} loss {loss.item():.4f} val acc {evaluate():.3f}", flush=True)
        dist.barrier()
guard.finish()
dist.destroy_process_group()
