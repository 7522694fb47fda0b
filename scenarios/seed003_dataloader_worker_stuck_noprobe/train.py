"""Seed 003: DataLoader workers (num_workers=2) get stuck in __getitem__ in the epoch after validation.

Epoch 1 trains and validates fine; in epoch 2 one item never returns (seed 003's workers hung in the
kernel on ROCm memory mappings; here an item waits on an event nothing sets). The training loop waits
for that batch forever.
"""
import threading

import torch


class Shapes(torch.utils.data.Dataset):
    def __init__(self) -> None:
        self.epoch = 1

    def __len__(self) -> int:
        return 64

    def __getitem__(self, idx: int):
        if self.epoch == 2 and idx == 37:
            threading.Event().wait()  # the planted hang: this item never comes back
        x = torch.randn(8, generator=torch.Generator().manual_seed(idx))
        return x, x.sum(dim=0, keepdim=True)


if __name__ == "__main__":
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    step = 0
    data = Shapes()
    for epoch in (1, 2):
        data.epoch = epoch
        loader = torch.utils.data.DataLoader(data, batch_size=4, num_workers=2)
        for x, y in loader:
            loss = (model(x) - y).pow(2).mean()
            loss.backward(); opt.step(); opt.zero_grad()
            step += 1; print(f"step {step} loss {loss.item():.4f}", flush=True)
        with torch.no_grad():
            val = sum((model(x) - y).pow(2).mean() for x, y in loader) / len(loader)
            print(f"val {val.item():.4f}", flush=True)
        print(f"epoch {epoch} validated", flush=True)
