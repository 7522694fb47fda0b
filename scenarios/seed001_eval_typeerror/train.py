"""Seed 001: evaluation first runs at step 200 and calls the model without `step`; `None % 500` crashes."""
import torch

import trainguard

torch.manual_seed(0)


class Student(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor, step: int | None = None) -> torch.Tensor:
        if step % 500 == 0 or step < 10:  # debug logging; `step` is None on the eval path
            pass
        return self.lin(x)


model = Student()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
guard = trainguard.watch(model, opt, total_steps=1000)
with guard.phase("train"):
    for step in range(1, 1001):
        loss = model(torch.randn(8, 16), step=step).pow(2).mean()
        loss.backward(); opt.step(); opt.zero_grad()
        guard.step(loss)
        if guard.due("eval", every=200):
            with guard.phase("eval"), torch.no_grad():
                val = model(torch.randn(8, 16)).pow(2).mean()  # no step= here
            guard.eval(loss=val)
guard.finish()
