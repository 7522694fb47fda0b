"""A DataLoader that fails only when iterated again: its dataset streams from a one-shot source, so the
second epoch (after 250 steps in the real run) raises before its first batch."""
import torch

import trainguard


class OneShotStream(torch.utils.data.IterableDataset):
    def __init__(self, n: int) -> None:
        self.n, self.used = n, False

    def __iter__(self):
        if self.used:
            raise RuntimeError("stream already consumed: cannot restart the source")
        self.used = True  # with persistent workers, this state survives into the next epoch
        g = torch.Generator().manual_seed(0)
        for _ in range(self.n):
            yield torch.randn(16, generator=g)


torch.manual_seed(0)
torch.set_num_threads(1)
loader = torch.utils.data.DataLoader(OneShotStream(2000), batch_size=8, num_workers=1, persistent_workers=True)
model = torch.nn.Linear(16, 1)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
guard = trainguard.watch(model, opt, total_steps=750)
with guard.phase("train"):
    for epoch in range(3):
        for x in guard.batches(loader):
            loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
            loss.backward(); opt.step(); opt.zero_grad()
            guard.step(loss)
guard.finish()
