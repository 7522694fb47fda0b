"""A small data-parallel job the way torchrun users write one: DDP over gloo, a DistributedSampler
shard per rank, cross-entropy on a classifier, gradient clipping, rank 0 prints.

    trainguard run -- torchrun --nproc_per_node=2 train.py [--bug nan|straggler|desync|crash]
    TRAINGUARD_ZOO_BACKEND=nccl trainguard run -- torchrun --nproc_per_node=2 train.py [--bug ...]

Without `--bug` it is healthy (the quiet twin of the four scenarios that plant one bug each):
- nan: one record of rank 1's shard has a missing feature, read as NaN (a CSV with an empty cell);
- straggler: rank 1 reads its shard from slower storage (4 ms a record, a network disk);
- desync: gradient clipping moved under `if rank == 0:` with the logging of the norm, so the replicas
  step with different gradients and drift apart;
- crash: one record of rank 1's shard has a label outside the classes: cross_entropy raises on rank 1,
  rank 0 then loses its peer in the next all-reduce.

TRAINGUARD_ZOO_BACKEND=nccl (`python scenarios/zoo.py --backend nccl ...`): the same job over NCCL, one GPU
a rank (LOCAL_RANK), the process group bound to it at once (`device_id`), batches pinned and copied
without blocking, the forward under bf16 autocast, and rank 0's log kept on the device and printed after
the loop, as a loop that never waits for its GPU does. The healthy job then also runs with
`torch.cuda.set_sync_debug_mode("error")` from step 3 on: any host-device synchronisation in the loop,
the guard's included, raises (DDP synchronises once itself, rebuilding its buckets at step 2's forward).
On the GPU the crash is a device-side assert, not an IndexError: it surfaces later, at another call.
"""
import argparse
import contextlib
import datetime
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler

import trainguard

p = argparse.ArgumentParser()
p.add_argument("--bug", choices=["nan", "straggler", "desync", "crash"], default=None)
args = p.parse_args()

# a straggler is judged over at least 5 s of steps after the first 20 (TG703): ~35 ms steps need ~170
STEPS = 240 if args.bug == "straggler" else 40
BATCH = 8
CLASSES = 5
BAD_STEP = 12  # where the planted record sits in rank 1's shard (nan, crash)
NCCL = os.environ.get("TRAINGUARD_ZOO_BACKEND") == "nccl"
SYNC_CHECK = NCCL and args.bug is None  # the quiet twin proves no host-device sync in the loop (see above)


class Records(Dataset):
    """Feature rows and labels, as read from a file; rank 1's slow storage in the straggler case."""

    def __init__(self, n: int, rank: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 16, generator=g)
        self.y = (self.x[:, :CLASSES].argmax(1) + (torch.rand(n, generator=g) < 0.1).long()) % CLASSES
        # DistributedSampler (no shuffle) gives rank r the records r, r+2, ...: this is rank 1's BAD_STEP-th batch
        bad = 2 * ((BAD_STEP - 1) * BATCH + 3) + 1
        if args.bug == "nan":
            self.x[bad, 7] = float("nan")  # an empty cell in the feature file
        if args.bug == "crash":
            self.y[bad] = 7  # a label outside the 5 classes
        self.slow = args.bug == "straggler" and rank == 1

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        if self.slow:
            time.sleep(0.004)  # network storage on this rank's node
        return self.x[i], self.y[i]


if NCCL:
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", timeout=datetime.timedelta(minutes=5), device_id=device)
else:
    device = torch.device("cpu")
    dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=5))
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
torch.set_num_threads(1)
data = Records(STEPS * BATCH * world, rank)
loader = DataLoader(data, batch_size=BATCH, sampler=DistributedSampler(data, shuffle=False), pin_memory=NCCL)
net = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, CLASSES)).to(device)
model = DDP(net, device_ids=[device.index] if NCCL else None)
opt = torch.optim.SGD(model.parameters(), lr=0.5)
amp = torch.autocast("cuda", dtype=torch.bfloat16) if NCCL else contextlib.nullcontext()
shown = []  # NCCL: rank 0's log, on the device until the loop ends


def log(step, loss, norm):
    if NCCL:
        shown.append((step, loss.detach(), norm.detach()))
    else:
        print(f"step {step} loss {loss.item():.4f} grad norm {norm:.3f}", flush=True)


guard = trainguard.watch(model, opt, total_steps=STEPS)
for step, (x, y) in enumerate(loader, start=1):
    if SYNC_CHECK and step == 3:
        torch.cuda.set_sync_debug_mode("error")
    x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
    with amp:
        loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    if args.bug == "desync":
        if rank == 0:  # the bug: clipping went under the logging branch
            norm = nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            log(step, loss, norm)
    else:
        norm = nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        if rank == 0:
            log(step, loss, norm)
    opt.step()
    guard.step(loss)
if SYNC_CHECK:
    torch.cuda.set_sync_debug_mode(0)
for step, loss, norm in shown:
    print(f"step {step} loss {loss.item():.4f} grad norm {norm.item():.3f}", flush=True)
guard.finish()
dist.destroy_process_group()
