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

TRAINGUARD_ZOO_BACKEND=nccl (`python scenarios/zoo.py --backend nccl ...`): the same job over NCCL, one GPU
a rank, the process groups bound to it (`device_id`: both groups' communicators made at once). Then no
host waits inside a collective: rank 0's extra all-reduce returns at once and its GPU waits in it, with
everything queued after it; rank 0's host runs on to its next `loss.item()` (step 20) and waits there,
rank 1's to the end of its data and waits in `guard.finish()`. 24 steps instead of 32 (384 rows), so a
host never has more than a few hundred kernels queued behind the hang (a full launch queue would block
it holding the interpreter lock: no answer from its probe).
"""
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

HEALTHY = "--healthy" in sys.argv
BAD_STEP = 12

NCCL = os.environ.get("TRAINGUARD_ZOO_BACKEND") == "nccl"
if NCCL:
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", timeout=datetime.timedelta(minutes=10), device_id=device)
else:
    device = torch.device("cpu")
    dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=10))
rank = dist.get_rank()
torch.manual_seed(0)
ROWS = 384 if NCCL else 512
X = torch.randn(ROWS, 8)
y = X @ torch.randn(8, 1) + 0.1 * torch.randn(ROWS, 1)
sampler = DistributedSampler(TensorDataset(X, y), shuffle=True)
loader = DataLoader(TensorDataset(X, y), batch_size=8, sampler=sampler, pin_memory=NCCL)
net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)).to(device)
model = DDP(net, device_ids=[device.index] if NCCL else None)
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
    xb, yb = xb.to(device, non_blocking=True), yb.to(device, non_blocking=True)
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
