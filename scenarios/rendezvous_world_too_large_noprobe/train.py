"""A world size larger than the processes started, no code change (TG712 rendezvous-incomplete).

Modelled on pytorch/pytorch#49846 ("torch init_process_group always hangs": `init_process_group(...,
init_method='tcp://localhost:9129', rank=0, world_size=2)` in one process; the answer: "do you have another
process calling init_process_group with rank=1?") and the "pass nprocs=world_size to mp.spawn()" answers
of the same kind. Rank 0 hosts the c10d store and waits for a rank 1 that nobody starts; PyTorch prints
nothing until its timeout (30 min by default, 75 s here so the scenario ends, with room for the watch under a loaded machine).
"""
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

rank = int(sys.argv[1]) if len(sys.argv) > 1 else 0
port = os.environ.get("PET_MASTER_PORT", "29531")  # the zoo's free port
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                        timeout=timedelta(seconds=75))
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
for step in range(20):
    x = torch.randn(16, 8)
    loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    if rank == 0 and step % 5 == 0:
        print(f"step {step} loss {loss.item():.4f}", flush=True)
dist.destroy_process_group()
