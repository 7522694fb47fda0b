"""Healthy workload written like PyTorch's examples/vae/main.py, on synthetic binary 14x14 images.

Encoder/decoder MLP, reparameterisation with randn_like, BCE + KL, Adam, train()/test() with
model.train()/model.eval() and a sample from the prior under no_grad.
"""
import torch
from torch import nn, optim
from torch.nn import functional as F

import trainguard

D = 14 * 14


class VAE(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(D, 200)
        self.fc21 = nn.Linear(200, 10)
        self.fc22 = nn.Linear(200, 10)
        self.fc3 = nn.Linear(10, 200)
        self.fc4 = nn.Linear(200, D)

    def encode(self, x):
        h1 = F.relu(self.fc1(x))
        return self.fc21(h1), self.fc22(h1)

    def reparameterize(self, mu, logvar):
        std = torch.exp(0.5 * logvar)
        eps = torch.randn_like(std)
        return mu + eps * std

    def decode(self, z):
        return torch.sigmoid(self.fc4(F.relu(self.fc3(z))))

    def forward(self, x):
        mu, logvar = self.encode(x.view(-1, D))
        z = self.reparameterize(mu, logvar)
        return self.decode(z), mu, logvar


def loss_function(recon_x, x, mu, logvar):
    bce = F.binary_cross_entropy(recon_x, x.view(-1, D), reduction="sum")
    kld = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
    return bce + kld


def images(n, seed):
    gen = torch.Generator().manual_seed(seed)
    protos = torch.rand(10, D, generator=torch.Generator().manual_seed(3))
    y = torch.randint(10, (n,), generator=gen)
    return torch.utils.data.TensorDataset((torch.rand(n, D, generator=gen) < protos[y]).float(), y)


def main():
    torch.manual_seed(1); torch.set_num_threads(1)
    train_loader = torch.utils.data.DataLoader(images(2048, 0), batch_size=128, shuffle=True)
    test_loader = torch.utils.data.DataLoader(images(512, 1), batch_size=128)
    model = VAE()
    optimizer = optim.Adam(model.parameters(), lr=1e-3)
    epochs = 4
    guard = trainguard.watch(model, optimizer, total_steps=epochs * len(train_loader))
    for epoch in range(1, epochs + 1):
        model.train()
        for data, _ in guard.batches(train_loader):
            optimizer.zero_grad()
            recon_batch, mu, logvar = model(data)
            loss = loss_function(recon_batch, data, mu, logvar)
            loss.backward()
            optimizer.step()
            guard.step(loss / len(data))
        model.eval()
        test_loss = 0.0
        with guard.phase("eval"), torch.no_grad():
            for data, _ in test_loader:
                recon_batch, mu, logvar = model(data)
                test_loss += loss_function(recon_batch, data, mu, logvar).item()
            sample = model.decode(torch.randn(64, 10))
        guard.eval(loss=test_loss / len(test_loader.dataset))
        print(f"epoch {epoch}: test loss {test_loss / len(test_loader.dataset):.2f}, sample mean {sample.mean():.3f}")
    guard.finish()


if __name__ == "__main__":
    main()
