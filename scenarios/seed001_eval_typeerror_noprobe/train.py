"""Seed 001 without the probe: the crash is read from the traceback on stderr."""
import torch

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
for step in range(1, 1001):
    loss = model(torch.randn(8, 16), step=step).pow(2).mean()
    loss.backward(); opt.step(); opt.zero_grad()
    if step % 100 == 0:
        print(f"step {step} loss={loss.item():.4f}", flush=True)
    if step % 200 == 0:
        with torch.no_grad():
            val = model(torch.randn(8, 16)).pow(2).mean()
        print(f"eval loss={val.item():.4f}")
