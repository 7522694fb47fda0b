"""A checkpoint write that blocks forever: the checkpoint path is on a file system that stopped answering.

Simulated with a FIFO that nobody reads: `torch.save` opens it for writing and the open never returns,
as a write to a hung NFS mount never returns.
"""
import os

import torch

import trainguard

os.makedirs("ckpt", exist_ok=True)
if not os.path.exists("ckpt/last.pt"):
    os.mkfifo("ckpt/last.pt")  # the unresponsive "file system"

model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
guard = trainguard.watch(model, opt, total_steps=100)
for step in range(1, 101):
    loss = model(torch.randn(16, 8)).pow(2).mean()
    loss.backward(); opt.step(); opt.zero_grad()
    guard.step(loss)
    if step % 50 == 0:
        with guard.phase("save"):
            torch.save({"model": model.state_dict(), "step": step}, "ckpt/last.pt")  # the planted hang
            guard.checkpoint_saved("ckpt/last.pt")
guard.finish()
