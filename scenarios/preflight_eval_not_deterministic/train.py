"""Functional dropout that ignores `model.eval()` (TG216 eval-not-deterministic, found by preflight).

`F.dropout(x, p)` defaults to `training=True`, so the model drops activations in evaluation too and
every evaluation of the same batch gives another answer. Modelled on the reports of "model.eval() has
no effect / different predictions every time" traced to functional dropout (pytorch/pytorch#26338
"Behavior of F.dropout in eval mode", pytorch/pytorch#11999 "Dropout still active in .eval() mode"),
the kind of bug TrainCheck finds by running the same input twice.
"""
import torch
from torch import nn
from torch.nn import functional as F

import trainguard
from trainguard.demo.toys import clusters


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.dropout(torch.relu(self.fc1(x)), p=0.5))  # the bug: training=self.training missing


torch.manual_seed(0); torch.set_num_threads(1)
x, y = clusters(n=2304)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x[:2048], y[:2048]), batch_size=64, shuffle=True)
model = Net()
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
epochs = 3
guard = trainguard.watch(model, opt, total_steps=epochs * len(loader))
for epoch in range(epochs):
    model.train()
    for xb, yb in guard.batches(loader):
        opt.zero_grad()
        loss = F.cross_entropy(model(xb), yb)
        loss.backward(); opt.step()
        guard.step(loss)
        if guard.due("eval", every=50):
            model.eval()
            with guard.phase("eval"), torch.no_grad():
                acc = (model(x[2048:]).argmax(1) == y[2048:]).float().mean()
            guard.eval(accuracy=acc)
            model.train()
guard.finish()
