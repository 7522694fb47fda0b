"""The last batch of each epoch holds one sample and `squeeze()` drops its batch dimension, no code change
(TG543 batch-dim-lost, zero-code).

The zero-code form of contract_batch_dim_squeezed: rows come as (1, 16) tensors, the loop squeezes the
batches to (8, 16), and 1,001 rows in batches of 8 end each epoch with a batch of one that `squeeze()` turns
into (16,); Linear and cross_entropy accept it unbatched and nothing fails. Modelled on galsang/BiDAF-pytorch#26
("If we grub a batch whose size equals to 1, the `.squeeze()` would lead to the loss of the first
dimension") and NVIDIA/DeepLearningExamples#765. The script never imports trainguard.
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
        xb, yb = xb.squeeze(), yb.squeeze()  # the bug: (1, 1, 16) -> (16,)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
        running_loss += loss.item() * xb.size(0)
        seen += xb.size(0)
    print(f"epoch {epoch}: loss {running_loss / seen:.4f} over {seen} samples (the dataset has {len(x)})", flush=True)
