"""Seed 001 under preflight: the first evaluation (step 2000 of 5000) calls the model without `step`."""
import torch

import trainguard

torch.manual_seed(0)
torch.set_num_threads(1)


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
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 100))
guard = trainguard.watch(model, opt, sched, total_steps=5000)
with guard.phase("train"):
    for step in range(1, 5001):
        loss = model(torch.randn(8, 16), step=step).pow(2).mean()
        loss.backward(); opt.step(); sched.step(); opt.zero_grad()
        guard.step(loss)
        if guard.due("eval", every=2000):
            with guard.phase("eval"), torch.no_grad():
                val = model(torch.randn(8, 16)).pow(2).mean()  # no step= here
            guard.eval(loss=val)
guard.finish()
