"""Local SGD on two gloo ranks under torchrun: each rank steps on its own and the replicas are averaged
every 500 steps (torch's PeriodicModelAverager), so one rank can stop while the other goes on.

Each rank streams its batches from a reader thread (records from a remote store, 20 ms a read, into a
queue). With `--stall`, rank 1's stream stops at its 30th batch (the remote end stops answering): its
loop waits on the queue while rank 0 keeps training for ~9 s, until rank 1's read timeout (15 s) raises
and rank 0, by then in the averaging all-reduce, loses its peer.

    trainguard run -- torchrun --nproc_per_node=2 train.py [--stall]
"""
import argparse
import datetime
import queue
import threading
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager

import trainguard

p = argparse.ArgumentParser()
p.add_argument("--stall", action="store_true")
args = p.parse_args()

STEPS = 500
STALL_AT = 30  # rank 1's stream stops answering after this many batches (--stall)
READ_TIMEOUT = 15.0  # seconds the loop waits for a batch before it gives up


def stream(rank: int, out: queue.Queue) -> None:
    """The reader thread: records from the remote store, as batches."""
    g = torch.Generator().manual_seed(rank)
    remote_stalled = threading.Event()
    for i in range(STEPS):
        if args.stall and rank == 1 and i == STALL_AT:
            remote_stalled.wait()  # a read that never returns
        time.sleep(0.02)  # one read from the remote store
        x = torch.randn(64, 32, generator=g)
        out.put((x, x[:, :4].sum(1, keepdim=True)))


dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=5))
rank = dist.get_rank()
torch.manual_seed(0)
torch.set_num_threads(1)
model = nn.Sequential(nn.Linear(32, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
averager = PeriodicModelAverager(period=STEPS, warmup_steps=0)
batches: queue.Queue = queue.Queue(maxsize=8)
threading.Thread(target=stream, args=(rank, batches), daemon=True).start()
guard = trainguard.watch(model, opt, total_steps=STEPS)
for step in range(1, STEPS + 1):
    try:
        x, y = batches.get(timeout=READ_TIMEOUT)
    except queue.Empty:
        raise TimeoutError(f"rank {rank}: no batch from the stream for {READ_TIMEOUT:.0f} s") from None
    loss = nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    averager.average_parameters(model.parameters())  # an all-reduce every STEPS steps
    guard.step(loss)
    if rank == 0 and step % 100 == 0:
        print(f"step {step} loss {loss.item():.4f}", flush=True)
guard.finish()
dist.destroy_process_group()
