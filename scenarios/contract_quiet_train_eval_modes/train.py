"""Healthy twin of contract_eval_in_train_mode and contract_eval_before_train_init: the MNIST example's
train()/test() with model.train() and model.eval() where they belong, batch norm and dropout included,
a sanity evaluation before training, and one no_grad forward in training mode for a sample (as the
DCGAN example does)."""
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
epochs = 3
guard = trainguard.watch(model, opt, total_steps=epochs * len(train))


def evaluate() -> tuple[float, float]:
    model.eval()
    loss, correct = 0.0, 0
    with torch.no_grad():
        for xb, yb in test:
            out = model(xb)
            loss += nn.functional.cross_entropy(out, yb, reduction="sum").item()
            correct += (out.argmax(1) == yb).sum().item()
    return loss / len(test.dataset), correct / len(test.dataset)


with guard.phase("eval"):
    evaluate()  # sanity evaluation of the untrained model, before any training step
for epoch in range(epochs):
    model.train()
    with guard.phase("train"):
        for i, (xb, yb) in enumerate(guard.batches(train)):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(xb), yb)
            loss.backward()
            opt.step()
            guard.step(loss)
            if i == 10:
                with torch.no_grad():
                    model(x[:8])  # a look at a few predictions in training mode, as examples do
    with guard.phase("eval"):
        val_loss, acc = evaluate()
    guard.eval(loss=val_loss, accuracy=acc)
guard.finish()
