"""A GradScaler on CUDA and no autocast: the "mixed precision" run computes in fp32 (TG311 autocast-runs-fp32).

The AMP recipe copied in half: `scaler.scale(loss).backward()` and `scaler.step(opt)` are there, the
`torch.autocast` context around the forward is not, so every matmul runs in fp32 and the scaler guards
nothing. Modelled on the documented AMP contract (PyTorch's "Automatic Mixed Precision" recipe and the
torch.amp docs: autocast chooses the dtypes, GradScaler only scales the loss) and on
Lightning-AI/lightning-thunder#725, where autocast silently stopped applying to `prims.linear`.
Needs CUDA.
"""
import torch
from torch import nn

import trainguard

torch.manual_seed(0)
device = "cuda"
model = nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 1024), nn.GELU(), nn.Linear(1024, 10)).to(device)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
scaler = torch.amp.GradScaler(device)
steps = 60
guard = trainguard.watch(model, opt, total_steps=steps, scaler=scaler)
teacher = torch.randn(256, 10, device=device)
for step in range(1, steps + 1):
    x = torch.randn(64, 256, device=device)
    y = (x @ teacher).argmax(1)
    loss = nn.functional.cross_entropy(model(x), y)  # the bug: no torch.autocast(device_type="cuda") here
    opt.zero_grad()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    guard.step(loss)
guard.finish()
