"""A regression whose loss compares every prediction with every target (TG542 loss-broadcasts-batch).

The model outputs (B, 1), the loader's target is (B,): `F.mse_loss` broadcasts them to (B, B) and only
warns, and the warning is filtered like the rest. Modelled on the forum threads on regressions stuck at
predicting the mean ("Using a target size that is different to the input size", e.g. pytorch/pytorch#16045
"fail to throw error when computing loss between tensors with shapes [n, 1] and [n]" and
discuss.pytorch.org/t/148155 "Output of the model depends on the shape of the weights tensor").
"""
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
        loss = nn.functional.mse_loss(model(xb), yb)  # the bug: (64, 1) against (64,)
        loss.backward(); opt.step()
        guard.step(loss)
guard.finish()
