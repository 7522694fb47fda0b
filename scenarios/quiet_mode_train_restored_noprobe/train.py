"""Healthy twin of mode_train_in_eval_noprobe: `train()` calls `model.train()` itself (the fix of
pytorch/tutorials#1624); no code change for trainguard. Must stay quiet.
"""
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 64)
        self.bn1 = nn.BatchNorm1d(64)
        self.dropout = nn.Dropout(0.25)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.dropout(torch.relu(self.bn1(self.fc1(x)))))


def clusters(n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    centres = torch.randn(10, 16, generator=gen) * 3
    y = torch.randint(10, (n,), generator=gen)
    return centres[y] + torch.randn(n, 16, generator=gen), y


torch.manual_seed(0); torch.set_num_threads(1)
x, y = clusters(3072, torch.Generator().manual_seed(0))
train_loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x[:2048], y[:2048]), batch_size=64,
                                           shuffle=True)
test_loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x[2048:], y[2048:]), batch_size=256)
model = Net()
optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)


def train(epoch: int) -> None:
    model.train()
    for batch_idx, (data, target) in enumerate(train_loader):
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(data), target)
        loss.backward()
        optimizer.step()
        if batch_idx % 10 == 0:
            print(f"Train Epoch: {epoch} [{batch_idx * len(data)}/{len(train_loader.dataset)}] Loss: {loss.item():.6f}",
                  flush=True)


def test() -> None:
    model.eval()
    test_loss, correct = 0.0, 0
    with torch.no_grad():
        for data, target in test_loader:
            output = model(data)
            test_loss += nn.functional.cross_entropy(output, target, reduction="sum").item()
            correct += (output.argmax(1) == target).sum().item()
    n = len(test_loader.dataset)
    print(f"Test set: Average loss: {test_loss / n:.4f}, Accuracy: {correct}/{n} ({100.0 * correct / n:.0f}%)",
          flush=True)


model.eval()  # built for inference first: train() switches it back
for epoch in range(1, 4):
    train(epoch)
    test()
