"""Two gloo ranks under torchrun, DDP; at step 12 rank 0 alone all-reduces a metric (a rank-dependent branch).

The way it happens in real scripts: the logging code averages a metric over a group made for metrics, but
it sits under `if rank == 0:`, so rank 1 never joins. Rank 0 waits in that all-reduce; rank 1 goes on into
the next step's `loss.backward()`, where DDP's Reducer all-reduces the gradient buckets in C++, and waits
there for rank 0. Neither can finish (the process group's timeout is 10 minutes).

    trainguard run --stall-timeout 5 -- torchrun --nproc_per_node=2 train.py [--no-watch] [--healthy]

--no-watch: the script does not import trainguard (the automatic probe watches it).
--healthy: the twin: no extra all-reduce, but rank 1's backward at step 12 takes 20 s (a gradient hook
that sleeps, as a slow device or a rank busy elsewhere would), longer than the stall timeout; rank 0 waits
in DDP's gradient all-reduce meanwhile. Slow, not stuck: it must not be stopped.
"""
import datetime
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

HEALTHY = "--healthy" in sys.argv
BAD_STEP = 12

dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=10))
rank = dist.get_rank()
torch.manual_seed(0)
X = torch.randn(512, 8)
y = X @ torch.randn(8, 1) + 0.1 * torch.randn(512, 1)
sampler = DistributedSampler(TensorDataset(X, y), shuffle=True)
loader = DataLoader(TensorDataset(X, y), batch_size=8, sampler=sampler)
model = DDP(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
metrics = dist.new_group([0, 1])  # a group for the metrics, apart from DDP's
if "--no-watch" in sys.argv:
    guard = None
else:
    import trainguard

    guard = trainguard.watch(model, opt)


def slow_backward(grad):
    time.sleep(20)
    return grad


step = 0
for xb, yb in loader:
    if HEALTHY and rank == 1 and step == BAD_STEP:
        hook = model.module[0].weight.register_hook(slow_backward)
    loss = nn.functional.mse_loss(model(xb), yb)
    opt.zero_grad()
    loss.backward()
    opt.step()
    if HEALTHY and rank == 1 and step == BAD_STEP:
        hook.remove()
    if rank == 0 and step == BAD_STEP and not HEALTHY:
        mean = loss.detach().clone()
        dist.all_reduce(mean, group=metrics)  # the planted bug: rank 1 never joins
    if guard:
        guard.step(loss)
    if rank == 0 and step % 10 == 0:
        print(f"step {step} loss {loss.item():.4f}", flush=True)
    step += 1
if guard:
    guard.finish()
dist.destroy_process_group()
