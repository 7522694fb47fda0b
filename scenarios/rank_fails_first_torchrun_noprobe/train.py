"""Root cause first, with no probe: DDP on the CPU (gloo), 2 ranks launched by torchrun, run by
`trainguard run --no-auto` (nothing of trainguard inside the processes). At step 6 rank 1 meets a bad
shard and raises a ValueError; rank 0 then dies in its next all-reduce of "Connection closed by peer",
torchrun stops it with SIGTERM and raises its own ChildFailedError, the last traceback of all. What it
proves: the verdict names rank 1's ValueError, where it was raised, as the cause (from the `[rank1]:`
prefixes, the order of the tracebacks and torchrun's "Root Cause (first observed failure)"), and lists
rank 0's failure as a consequence. Healthy twin: quiet_torchrun_gloo_noprobe.
"""
import gc

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)


def get_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(16, 32)
    if rank == 1 and step == 6:  # the planted failure: one rank's shard is malformed
        raise ValueError(f"shard 3 of rank {rank}: expected 32 features per row, got 31")
    return x, x.sum(dim=1, keepdim=True)


for step in range(1, 41):
    x, y = get_batch(step)
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    if rank == 0:
        print(f"step {step} loss {loss.item():.4f}", flush=True)
# The model and optimizer go before the process group: PyTorch 2.13's gloo otherwise aborts a rank now and
# then as the process ends ("terminate called without an active exception", about 1 run in 10 on a loaded
# machine), which trainguard rightly reports as a crash at teardown.
del model, opt, loss
gc.collect()
dist.destroy_process_group()
