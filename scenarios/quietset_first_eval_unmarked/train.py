"""Healthy, quiet set: the first evaluation takes 70 s, longer than the default stall timeout (60 s), inside
`with guard.phase("eval"):` as the README shows, with the validation loader not wrapped in
`guard.batches` and nothing marked inside it. Forwards of the watched model are progress (the probe's
forward hook), so the run must complete with default settings.
"""
import time

import torch

import trainguard

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
guard = trainguard.watch(model, opt, total_steps=40)
val_loader = torch.utils.data.DataLoader(torch.randn(200, 64), batch_size=1)  # 200 batches

for step in range(1, 41):
    loss = model(torch.randn(16, 64)).pow(2).mean()
    loss.backward(); opt.step(); opt.zero_grad()
    guard.step(loss)
    time.sleep(0.02)
    if step == 20:
        with guard.phase("eval"), torch.no_grad():
            total = 0.0
            for x in val_loader:  # not wrapped: no batch marks
                total += model(x).pow(2).mean().item()
                time.sleep(0.35)  # a slow metric per batch: 200 x 0.35 s = 70 s of evaluation
            guard.eval(loss=total / len(val_loader))
guard.finish()
