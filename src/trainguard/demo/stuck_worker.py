"""Seed 003 in miniature: a DataLoader worker that never returns one item, in the epoch after validation.

    trainguard run --stall-timeout 3 -- python -m trainguard.demo.stuck_worker

Epoch 1 trains and validates; in epoch 2 one item waits on an event nothing sets (the seed's workers
hung in the kernel on ROCm memory mappings). The training loop waits for that batch forever, with no
error and no output: the watchdog's stacks show which worker, which frame and which sample.
"""

from __future__ import annotations

import threading

import torch

import trainguard


class Shapes(torch.utils.data.Dataset):
    def __init__(self) -> None:
        self.epoch = 1

    def __len__(self) -> int:
        return 64

    def __getitem__(self, idx: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.epoch == 2 and idx == 37:
            threading.Event().wait()  # the planted hang: this item never comes back
        x = torch.randn(8, generator=torch.Generator().manual_seed(idx))
        return x, x.sum(dim=0, keepdim=True)


if __name__ == "__main__":
    torch.set_num_threads(1)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    guard = trainguard.watch(model, optimizer)
    data = Shapes()
    for epoch in (1, 2):
        data.epoch = epoch
        loader = torch.utils.data.DataLoader(data, batch_size=4, num_workers=2)
        with guard.phase("train"):
            for x, y in guard.batches(loader):
                loss = (model(x) - y).pow(2).mean()
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
                guard.step(loss)
        with guard.phase("eval"), torch.no_grad():
            val = sum((model(x) - y).pow(2).mean() for x, y in guard.batches(loader)) / len(loader)
            guard.eval(loss=val)
        print(f"epoch {epoch} validated", flush=True)
    guard.finish()
