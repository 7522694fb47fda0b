"""Healthy twin of rendezvous_world_too_large_noprobe: the same script, and rank 1 started beside rank 0
(the answer of pytorch/pytorch#49846). No code change for trainguard; must stay quiet.
"""
import os
import subprocess
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

rank = int(sys.argv[1]) if len(sys.argv) > 1 else 0
peer = subprocess.Popen([sys.executable, __file__, "1"]) if rank == 0 else None  # the rank that was missing
port = os.environ.get("PET_MASTER_PORT", "29531")  # the zoo's free port
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                        timeout=timedelta(seconds=30))
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for step in range(20):
    x = torch.randn(16, 8)
    loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    if rank == 0 and step % 5 == 0:
        print(f"step {step} loss {loss.item():.4f}", flush=True)
dist.destroy_process_group()
if peer is not None:
    sys.exit(peer.wait())
