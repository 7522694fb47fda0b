"""A model trained in eval mode: `model.eval()` at start-up, `model.train()` never (TG215 eval-before-train-init).

Modelled on pytorch/pytorch#51800 ("spectral_norm not properly initialized if used with eval first",
labelled "module: correctness (silent)": state that only a training-mode forward initialises, used
before any) and pytorch/tutorials#1540 (the quickstart's `test()` called `model.eval()` and nothing
called `model.train()`, so every later epoch trained in eval mode; harmless there, with no dropout or
batch norm, but copied into models that have them). Here `model.eval()` comes before the first epoch:
the batch-norm layers normalise with their initial statistics for the whole run and the evaluation
quietly reports it as a bad model.
"""
import torch
from torch import nn

import trainguard
from trainguard.demo.toys import clusters


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 64),
                                  nn.BatchNorm1d(64), nn.ReLU())
        self.head = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


torch.manual_seed(0); torch.set_num_threads(1)
x, y = clusters(n=2560)
model = Net()
model.eval()  # "inference-ready" after building it (as a predict script would)... and never model.train()
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
steps = 60
guard = trainguard.watch(model, opt, total_steps=steps)
gen = torch.Generator().manual_seed(0)
for step in range(1, steps + 1):
    idx = torch.randint(2048, (64,), generator=gen)
    loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
    opt.zero_grad(); loss.backward(); opt.step()
    guard.step(loss)
    if guard.due("eval", every=20):
        with guard.phase("eval"), torch.no_grad():
            model.eval()
            acc = (model(x[2048:]).argmax(1) == y[2048:]).float().mean()
        guard.eval(accuracy=acc)
guard.finish()
