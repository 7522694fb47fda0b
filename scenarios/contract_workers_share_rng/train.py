"""A Dataset that owns its NumPy generator, read by 2 DataLoader workers (TG541 workers-share-rng).

Modelled on wolny/pytorch-3dunet#32 ("np.random generates the same random numbers for each data batch":
the random rotations and contrast were the same in each batch; the maintainer: "the workers share the
common instance of the `Dataset` which was initialized with a fixed seed") and xingyizhou/CenterNet#233
(identical augmentations across workers and again each epoch). The global NumPy generator of
pytorch/pytorch#5059 is now seeded in each worker (pytorch/pytorch#56488), but a generator the dataset
holds is copied into each worker as it is, so both workers (and every epoch, the workers being
restarted) add the same "random" noise.
"""
import numpy as np
import torch
from torch import nn

import trainguard


class NoisyPoints(torch.utils.data.Dataset):
    def __init__(self, n: int = 1024) -> None:
        gen = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 8, generator=gen)
        self.y = (self.x.sum(1, keepdim=True) > 0).float()
        self.rng = np.random.default_rng(0)  # the bug: one generator, copied into every worker

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        noise = torch.from_numpy(self.rng.normal(0.0, 0.1, size=8).astype("float32"))  # augmentation
        return self.x[i] + noise, self.y[i]


if __name__ == "__main__":
    torch.manual_seed(0); torch.set_num_threads(1)
    loader = torch.utils.data.DataLoader(NoisyPoints(), batch_size=64, shuffle=True, num_workers=2)
    model = nn.Sequential(nn.Linear(8, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    epochs = 3
    guard = trainguard.watch(model, opt, total_steps=epochs * len(loader))
    for epoch in range(epochs):
        for xb, yb in guard.batches(loader):
            opt.zero_grad()
            loss = nn.functional.binary_cross_entropy_with_logits(model(xb), yb)
            loss.backward(); opt.step()
            guard.step(loss)
    guard.finish()
