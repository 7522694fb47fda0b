"""Two gloo ranks whose DDP model is moved after wrapping (TG704 grad-norms-differ, TG701 replicas-diverged).

Modelled on pytorch/pytorch#104336 ("DDP: moving model to CPU and back to GPU breaks gradient
synchronization"; the maintainer: moving the model "modifies the backing tensors of the model's
Parameters. DDP register autograd hooks to the original tensors and it won't see the new ones", and
the fix is to wrap again after the move). Here the model is wrapped, then moved off and back for an
evaluation in float64 precision. On this CPU-only zoo the move is a dtype round trip: it goes through
the same `Module._apply` as `.cpu()` and `.cuda()` and replaces every parameter's tensor the same way.
The forward goes through the DDP wrapper, so the script looks right; no gradient is all-reduced and
each rank learns from its own shard. The launcher (this script without arguments) starts both ranks.
"""
import datetime
import os
import socket
import subprocess
import sys

import torch
from torch import nn


def launch() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen([sys.executable, __file__, str(rank)],
                              env={**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "MASTER_PORT": str(port)})
             for rank in (0, 1)]
    return max(p.wait() for p in procs)


def train(rank: int) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import trainguard

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}", rank=rank,
                            world_size=2, timeout=datetime.timedelta(minutes=5))
    torch.manual_seed(0); torch.set_num_threads(1)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
    ddp_model = DDP(model)
    model.to(torch.float64)  # the bug: moved after wrapping (here for a float64 check; .cpu()/.cuda() alike)
    model.to(torch.float32)
    opt = torch.optim.SGD(ddp_model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(100 + rank)  # each rank its own shard of the data
    steps = 40
    guard = trainguard.watch(ddp_model, opt, total_steps=steps)
    for step in range(1, steps + 1):
        x = torch.randn(32, 16, generator=gen)
        y = x.sum(1, keepdim=True)
        loss = nn.functional.mse_loss(ddp_model(x), y)
        opt.zero_grad(); loss.backward(); opt.step()
        guard.step(loss)
    dist.barrier()
    guard.finish()
    dist.destroy_process_group()


if __name__ == "__main__":
    if len(sys.argv) > 1:
        train(int(sys.argv[1]))
    else:
        sys.exit(launch())
