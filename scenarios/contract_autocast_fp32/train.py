"""bf16 autocast that never reaches the model's layers (TG311 autocast-runs-fp32).

The training step runs under `torch.autocast("cpu", dtype=torch.bfloat16)`, but the model's forward
wraps its body in an `enabled=False` region copied from a numerically sensitive loss, so every Linear
computes in float32: the run pays for mixed precision and gets none. Modelled on
Lightning-AI/lightning-thunder#725 ("torch.autocast context manager got broken for prims.linear": Thunder
applied autocast to torch symbols only, so a linear inside the autocast region ran in fp32), which
TrainCheck lists among its silent bugs.
"""
import torch
from torch import nn

import trainguard
from trainguard.demo.toys import clusters, minibatch


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(16, 256), nn.GELU(), nn.Linear(256, 256), nn.GELU(), nn.Linear(256, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device_type=x.device.type, enabled=False):  # "for stability"
            return self.layers(x.float())


torch.manual_seed(0); torch.set_num_threads(1)
x, y = clusters()
gen = torch.Generator().manual_seed(0)
model = Net()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
steps = 60
guard = trainguard.watch(model, opt, total_steps=steps)
for step in range(1, steps + 1):
    xb, yb = minibatch(x, y, 64, gen)
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        loss = nn.functional.cross_entropy(model(xb), yb)
    opt.zero_grad(); loss.backward(); opt.step()
    guard.step(loss)
guard.finish()
