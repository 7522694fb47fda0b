"""The last batch of each epoch holds one sample and `squeeze()` drops its batch dimension (TG543 batch-dim-lost).

The dataset returns each row as a (1, 16) tensor and its label as (1,) (rows sliced out of a table), so
the loader's batches are (8, 1, 16) and (8, 1) and the loop squeezes them to (8, 16) and (8,). 1,001 rows
in batches of 8 end every epoch with a batch of one, which `squeeze()` turns into (16,) and (). Linear
layers and `cross_entropy` accept unbatched input, so nothing fails; the running loss, weighted by
`x.size(0)` as in PyTorch's transfer-learning tutorial, counts that one sample 16 times. Modelled on the
reports of this squeeze, where a later layer happened to fail: galsang/BiDAF-pytorch#26 ("If we grub a
batch whose size equals to 1, the `.squeeze()` would lead to the loss of the first dimension"),
layumi/Person_reID_baseline_pytorch#77 (`torch.squeeze(x)` on [1, 2048, 1, 1] when the last batch of the
data loader holds one sample) and NVIDIA/DeepLearningExamples#765 ("When batch size is 1, `squeeze`
collapses the batch dimension").
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
        xb, yb = xb.squeeze(), yb.squeeze()  # the bug: (8, 1, 16) -> (8, 16), but (1, 1, 16) -> (16,)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
        guard.step(loss)
        running_loss += loss.item() * xb.size(0)  # the batch of 1 counts as 16
        seen += xb.size(0)
    print(f"epoch {epoch}: loss {running_loss / seen:.4f} over {seen} samples (the dataset has {len(x)})")
guard.finish()
