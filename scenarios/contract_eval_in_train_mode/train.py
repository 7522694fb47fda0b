"""Evaluation without `model.eval()` (TG214 eval-in-train-mode).

Written like PyTorch's MNIST example, with one line missing: the evaluation runs under `torch.no_grad()`
and the guard's eval phase, but the model stays in training mode, so dropout stays on and batch norm
normalises with the evaluation batch and updates its running statistics with it. Modelled on
udacity/deep-learning-v2-pytorch#3 (notebooks whose models have dropout validated without
`model.eval()`; the author: "This was an oversight of mine") and the forum thread "'model.eval()' vs
'with torch.no_grad()'" on why `no_grad` alone is not evaluation mode.
"""
import torch
from torch import nn

import trainguard
from trainguard.demo.toys import clusters


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 64)
        self.bn1 = nn.BatchNorm1d(64)
        self.dropout = nn.Dropout(0.25)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.dropout(torch.relu(self.bn1(self.fc1(x)))))


torch.manual_seed(0); torch.set_num_threads(1)
x, y = clusters(n=3072)
train = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x[:2048], y[:2048]), batch_size=64, shuffle=True)
test = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x[2048:], y[2048:]), batch_size=256)
model = Net()
opt = torch.optim.Adadelta(model.parameters(), lr=1.0)
epochs = 2
guard = trainguard.watch(model, opt, total_steps=epochs * len(train))


def evaluate() -> tuple[float, float]:
    # the bug: no model.eval() here (and no model.train() after)
    loss, correct = 0.0, 0
    with torch.no_grad():
        for xb, yb in test:
            out = model(xb)
            loss += nn.functional.cross_entropy(out, yb, reduction="sum").item()
            correct += (out.argmax(1) == yb).sum().item()
    return loss / len(test.dataset), correct / len(test.dataset)


model.train()
for epoch in range(epochs):
    with guard.phase("train"):
        for xb, yb in guard.batches(train):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(xb), yb)
            loss.backward()
            opt.step()
            guard.step(loss)
    with guard.phase("eval"):
        val_loss, acc = evaluate()
    guard.eval(loss=val_loss, accuracy=acc)
guard.finish()
