"""Healthy workload written like PyTorch's examples/mnist/main.py, on synthetic 14x14 digits (no download).

Conv net with dropout, Adadelta + StepLR, train()/test() with model.train()/model.eval(), a DataLoader
with a worker. Must run under the guard with no warning.
"""
import torch
import torch.nn.functional as F
from torch import nn, optim
from torch.optim.lr_scheduler import StepLR

import trainguard


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, 1)
        self.conv2 = nn.Conv2d(16, 32, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(32 * 5 * 5, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = self.dropout2(x)
        return F.log_softmax(self.fc2(x), dim=1)


def digits(n, seed):
    """Ten fixed 14x14 stroke patterns plus noise: a task a small CNN learns in a few hundred steps."""
    gen = torch.Generator().manual_seed(seed)
    protos = (torch.rand(10, 1, 14, 14, generator=torch.Generator().manual_seed(7)) > 0.7).float()
    y = torch.randint(10, (n,), generator=gen)
    x = protos[y] + 0.5 * torch.randn(n, 1, 14, 14, generator=gen)
    return torch.utils.data.TensorDataset((x - 0.3) / 0.6, y)


def train(model, loader, optimizer, guard):
    model.train()
    for data, target in guard.batches(loader):
        optimizer.zero_grad()
        loss = F.nll_loss(model(data), target)
        loss.backward()
        optimizer.step()
        guard.step(loss)


def test(model, loader):
    model.eval()
    test_loss, correct = 0.0, 0
    with torch.no_grad():
        for data, target in loader:
            output = model(data)
            test_loss += F.nll_loss(output, target, reduction="sum").item()
            correct += output.argmax(dim=1).eq(target).sum().item()
    return test_loss / len(loader.dataset), correct / len(loader.dataset)


def main():
    torch.manual_seed(1); torch.set_num_threads(1)
    train_loader = torch.utils.data.DataLoader(digits(3072, 0), batch_size=64, shuffle=True, num_workers=1)
    test_loader = torch.utils.data.DataLoader(digits(1000, 1), batch_size=500)
    model = Net()
    optimizer = optim.Adadelta(model.parameters(), lr=1.0)
    scheduler = StepLR(optimizer, step_size=1, gamma=0.7)
    epochs = 3
    guard = trainguard.watch(model, optimizer, scheduler, total_steps=epochs * len(train_loader))
    for epoch in range(1, epochs + 1):
        with guard.phase("train"):
            train(model, train_loader, optimizer, guard)
        with guard.phase("eval"):
            loss, acc = test(model, test_loader)
        guard.eval(loss=loss, accuracy=acc)
        print(f"epoch {epoch}: test loss {loss:.4f}, accuracy {acc:.3f}")
        scheduler.step()
    guard.finish()


if __name__ == "__main__":
    main()
