"""Healthy twin of autocast_fp32_noprobe: the same bf16 autocast step, the model's layers inside it.
No code change for trainguard; must stay quiet.
"""
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(16, 256), nn.GELU(), nn.Linear(256, 256), nn.GELU(), nn.Linear(256, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


torch.manual_seed(0); torch.set_num_threads(1)
gen = torch.Generator().manual_seed(0)
centres = torch.randn(10, 16, generator=gen) * 3
model = Net()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(1, 61):
    y = torch.randint(10, (64,), generator=gen)
    x = centres[y] + torch.randn(64, 16, generator=gen)
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(); loss.backward(); opt.step()
    if step % 10 == 0:
        print(f"step {step} loss {loss.item():.4f}", flush=True)
