"""Healthy workload written like PyTorch's examples/siamese_network: one CNN tower applied to both
images of a pair, features concatenated, a head with BCE on "same class?", StepLR (with Adam: Adadelta
needs more epochs on this small task than a test should take), a Dataset that builds pairs (positive
or negative at random), test() with model.eval().
"""
import random

import torch
from torch import nn, optim
from torch.optim.lr_scheduler import StepLR

import trainguard


class SiameseNetwork(nn.Module):
    def __init__(self):
        super().__init__()
        self.tower = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                                   nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
                                   nn.Flatten())
        self.fc = nn.Sequential(nn.Linear(144 * 2, 64), nn.ReLU(inplace=True), nn.Linear(64, 1))
        self.sigmoid = nn.Sigmoid()

    def forward_once(self, x):
        return self.tower(x)

    def forward(self, input1, input2):
        output = torch.cat((self.forward_once(input1), self.forward_once(input2)), 1)
        return self.sigmoid(self.fc(output))


class APP_MATCHER(torch.utils.data.Dataset):
    """Pairs of 12x12 synthetic digits: target 1 for the same class, 0 otherwise."""

    def __init__(self, n, seed):
        gen = torch.Generator().manual_seed(seed)
        protos = (torch.rand(10, 1, 12, 12, generator=torch.Generator().manual_seed(7)) > 0.7).float()
        self.y = torch.randint(10, (n,), generator=gen)
        self.x = protos[self.y] + 0.2 * torch.randn(n, 1, 12, 12, generator=gen)
        self.by_class = [torch.nonzero(self.y == c).flatten().tolist() for c in range(10)]

    def __len__(self):
        return len(self.y)

    def __getitem__(self, index):
        c = int(self.y[index])
        if random.random() < 0.5:
            j, target = random.choice(self.by_class[c]), 1.0
        else:
            other = random.choice([k for k in range(10) if k != c])
            j, target = random.choice(self.by_class[other]), 0.0
        return self.x[index], self.x[j], torch.tensor(target)


def main():
    torch.manual_seed(1); random.seed(1); torch.set_num_threads(1)
    train_loader = torch.utils.data.DataLoader(APP_MATCHER(2048, 0), batch_size=64, shuffle=True)
    test_loader = torch.utils.data.DataLoader(APP_MATCHER(512, 1), batch_size=256)
    model = SiameseNetwork()
    optimizer = optim.Adam(model.parameters(), lr=3e-3)
    scheduler = StepLR(optimizer, step_size=1, gamma=0.7)
    criterion = nn.BCELoss()
    epochs = 4
    guard = trainguard.watch(model, optimizer, scheduler, total_steps=epochs * len(train_loader))
    for epoch in range(1, epochs + 1):
        model.train()
        for images_1, images_2, targets in guard.batches(train_loader):
            optimizer.zero_grad()
            outputs = model(images_1, images_2).squeeze()
            loss = criterion(outputs, targets)
            loss.backward()
            optimizer.step()
            guard.step(loss)
        model.eval()
        test_loss, correct = 0.0, 0
        with guard.phase("eval"), torch.no_grad():
            for images_1, images_2, targets in test_loader:
                outputs = model(images_1, images_2).squeeze()
                test_loss += criterion(outputs, targets).sum().item()
                correct += torch.where(outputs > 0.5, 1, 0).eq(targets.view_as(outputs)).sum().item()
        guard.eval(loss=test_loss / len(test_loader), accuracy=correct / len(test_loader.dataset))
        print(f"epoch {epoch}: test loss {test_loss / len(test_loader):.4f}, acc {correct / len(test_loader.dataset):.3f}")
        scheduler.step()
    guard.finish()


if __name__ == "__main__":
    main()
