"""Healthy twin of contract_batch_dim_squeezed: the same rows, batches and last batch of one, squeezed with
`x.squeeze(1)`, which drops the row dimension and keeps the batch dimension: (1, 1, 16) -> (1, 16).
"""
import torch
from torch import nn

import trainguard
from trainguard.demo.toys import MLP, clusters


class Rows(torch.utils.data.Dataset):
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i:i + 1], self.y[i:i + 1]  # a (1, 16) row and a (1,) label, as `df.iloc[[i]]` gives


torch.manual_seed(0); torch.set_num_threads(1)
x, y = clusters(n=1001, spread=1.5)
loader = torch.utils.data.DataLoader(Rows(x, y), batch_size=8, shuffle=True)
model = MLP()
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
epochs = 2
guard = trainguard.watch(model, opt, total_steps=epochs * len(loader))
for epoch in range(epochs):
    running_loss, seen = 0.0, 0
    for xb, yb in guard.batches(loader):
        xb, yb = xb.squeeze(1), yb.squeeze(1)  # only the row dimension: (1, 1, 16) -> (1, 16)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
        guard.step(loss)
        running_loss += loss.item() * xb.size(0)
        seen += xb.size(0)
    print(f"epoch {epoch}: loss {running_loss / seen:.4f} over {seen} samples (the dataset has {len(x)})")
guard.finish()
