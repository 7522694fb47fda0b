"""Healthy, quiet set, default settings: the first checkpoint goes to slow storage and takes ~66 s, longer
than the default stall timeout (60 s), written in pieces as a network file system accepts them, inside
`guard.phase("save")` with no step, no mark and no output line. What it proves: bytes the run writes to its
files are progress, so no stall is reported at all and the run ends `completed`, quiet. Hang twin:
checkpoint_write_blocks (a write that never returns: found at the stall timeout, stopped at its limit).
"""
import time

import torch

import trainguard

model = torch.nn.Linear(64, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
guard = trainguard.watch(model, opt, total_steps=40)


def save_to_slow_storage(path: str) -> None:
    """33 MiB in 1 MiB pieces, 2 s apart: how a slow NFS mount takes a checkpoint."""
    piece = bytes(1 << 20)
    with open(path, "wb") as fh:
        for _ in range(33):
            fh.write(piece); fh.flush()
            time.sleep(2.0)
        torch.save(model.state_dict(), fh)


for step in range(1, 41):
    loss = model(torch.randn(16, 64)).pow(2).mean()
    loss.backward(); opt.step(); opt.zero_grad()
    guard.step(loss)
    time.sleep(0.02)
    if step == 20:
        with guard.phase("save"):
            save_to_slow_storage("ckpt-20.pt")
            guard.checkpoint_saved("ckpt-20.pt")
guard.finish()
