"""Seed 003 as it ran: spawn-context DataLoader workers (persistent) stuck in __getitem__ after validation.

Spawned workers do not inherit the probe through fork: they import this module (and so trainguard),
and the probe's environment tells them to install the stack-dump handler. After the first validation
the main process leaves a marker that the workers' item 37 trips over (in seed 003, ROCm's memory
mappings after validation); the loop waits for that batch forever.
"""
import os
import threading

import torch

import trainguard


class Shapes(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, idx: int):
        if idx == 37 and os.path.exists("validated.flag"):
            threading.Event().wait()  # the planted hang: this item never comes back after validation
        x = torch.randn(8, generator=torch.Generator().manual_seed(idx))
        return x, x.sum(dim=0, keepdim=True)


if __name__ == "__main__":
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    guard = trainguard.watch(model, opt)
    loader = torch.utils.data.DataLoader(Shapes(), batch_size=4, num_workers=2, persistent_workers=True,
                                         multiprocessing_context="spawn")
    for epoch in (1, 2):
        with guard.phase("train"):
            for x, y in guard.batches(loader):
                loss = (model(x) - y).pow(2).mean()
                loss.backward(); opt.step(); opt.zero_grad()
                guard.step(loss)
        with guard.phase("eval"), torch.no_grad():
            val = sum((model(x) - y).pow(2).mean() for x, y in guard.batches(torch.utils.data.DataLoader(Shapes(), batch_size=16)))
            guard.eval(loss=val)
        open("validated.flag", "w").close()
        print(f"epoch {epoch} validated", flush=True)
    guard.finish()
