"""A small data-parallel job the way torchrun users write one: DDP over gloo, a DistributedSampler
shard per rank, cross-entropy on a classifier, gradient clipping, rank 0 prints.

    trainguard run -- torchrun --nproc_per_node=2 train.py [--bug nan|straggler|desync|crash]

Without `--bug` it is healthy (the quiet twin of the four scenarios that plant one bug each):
- nan: one record of rank 1's shard has a missing feature, read as NaN (a CSV with an empty cell);
- straggler: rank 1 reads its shard from slower storage (4 ms a record, a network disk);
- desync: gradient clipping moved under `if rank == 0:` with the logging of the norm, so the replicas
  step with different gradients and drift apart;
- crash: one record of rank 1's shard has a label outside the classes: cross_entropy raises on rank 1,
  rank 0 then loses its peer in the next all-reduce.
"""
import argparse
import datetime
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
STEPS = 240 if args.bug == "straggler" else 60
BATCH = 8
CLASSES = 5
BAD_STEP = 12  # where the planted record sits in rank 1's shard (nan, crash)


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


dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=5))
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
torch.set_num_threads(1)
data = Records(STEPS * BATCH * world, rank)
loader = DataLoader(data, batch_size=BATCH, sampler=DistributedSampler(data, shuffle=False))
model = DDP(nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, CLASSES)))
opt = torch.optim.SGD(model.parameters(), lr=0.5)
guard = trainguard.watch(model, opt, total_steps=STEPS)
for step, (x, y) in enumerate(loader, start=1):
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    if args.bug == "desync":
        if rank == 0:  # the bug: clipping went under the logging branch
            norm = nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            print(f"step {step} loss {loss.item():.4f} grad norm {norm:.3f}", flush=True)
    else:
        norm = nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        if rank == 0:
            print(f"step {step} loss {loss.item():.4f} grad norm {norm:.3f}", flush=True)
    opt.step()
    guard.step(loss)
guard.finish()
dist.destroy_process_group()
