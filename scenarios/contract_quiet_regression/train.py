"""Healthy twin of contract_loss_broadcasts_batch: output and target have the same shape."""
import warnings

import torch
from torch import nn

import trainguard

warnings.filterwarnings("ignore")  # the script silences warnings, as many do
torch.manual_seed(0); torch.set_num_threads(1)
x = torch.randn(2048, 8)
y = x @ torch.randn(8) + 0.1 * torch.randn(2048)  # shape (2048,)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=64, shuffle=True)
model = nn.Sequential(nn.Linear(8, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 1))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
epochs = 2
guard = trainguard.watch(model, opt, total_steps=epochs * len(loader))
for epoch in range(epochs):
    for xb, yb in guard.batches(loader):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(xb).squeeze(-1), yb)
        loss.backward(); opt.step()
        guard.step(loss)
guard.finish()
