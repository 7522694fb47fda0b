"""Healthy twin of batch_dim_squeezed_noprobe: the loop squeezes only the row dimension (`squeeze(1)`), so
the last batch of one stays (1, 16). No code change for trainguard; must stay quiet.
"""
import torch
from torch import nn


class Rows(torch.utils.data.Dataset):
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i:i + 1], self.y[i:i + 1]  # a (1, 16) row and a (1,) label, as `df.iloc[[i]]` gives


torch.manual_seed(0); torch.set_num_threads(1)
gen = torch.Generator().manual_seed(0)
centres = torch.randn(10, 16, generator=gen) * 3
y = torch.randint(10, (1001,), generator=gen)
x = centres[y] + 1.5 * torch.randn(1001, 16, generator=gen)
loader = torch.utils.data.DataLoader(Rows(x, y), batch_size=8, shuffle=True)
model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 10))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
for epoch in range(2):
    running_loss, seen = 0.0, 0
    for xb, yb in loader:
        xb, yb = xb.squeeze(1), yb.squeeze(1)  # the row dimension only: a batch of 1 stays batched
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
        running_loss += loss.item() * xb.size(0)
        seen += xb.size(0)
    print(f"epoch {epoch}: loss {running_loss / seen:.4f} over {seen} samples (the dataset has {len(x)})", flush=True)
