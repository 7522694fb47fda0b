"""Healthy twin of rank_fails_first_torchrun_noprobe: the same DDP loop on the CPU (gloo), 2 ranks launched
by torchrun under `trainguard run --no-auto`, every shard well formed. What it proves: a multi-rank job
with no probe ends `completed` with no warning (torchrun's banner and the ranks' prefixed lines are not
failures).
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
