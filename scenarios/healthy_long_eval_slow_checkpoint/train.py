"""Healthy: an evaluation three times longer than the stall timeout (it fetches batches, which is
progress) and a checkpoint that takes twice the stall timeout to write (it writes steadily, which is not
a hang). Neither may produce a hang finding.
"""
import json
import time

import torch

import trainguard

model = torch.nn.Linear(64, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
guard = trainguard.watch(model, opt, total_steps=40)


def slow_save(path: str, seconds: float) -> None:
    """Writes 24 MB in small pieces over `seconds`, as a slow network file system does."""
    blob = bytes(256 * 1024)
    with open(path, "wb") as fh:
        for _ in range(96):
            fh.write(blob); fh.flush()
            time.sleep(seconds / 96)
    torch.save(model.state_dict(), path + ".weights")


for step in range(1, 41):
    loss = model(torch.randn(16, 64)).pow(2).mean()
    loss.backward(); opt.step(); opt.zero_grad()
    guard.step(loss)
    time.sleep(0.02)
    if step == 20:
        with guard.phase("eval"), torch.no_grad():
            val = [model(x).pow(2).mean() for x in guard.batches(torch.randn(60, 16, 64))
                   if time.sleep(0.2) is None]  # 60 batches x 0.2 s = 12 s of evaluation
            guard.eval(loss=sum(val) / len(val))
    if step == 30:
        with guard.phase("save"):
            slow_save("last.pt", seconds=8.0)
            guard.checkpoint_saved("last.pt")
json.dump({"steps": 40}, open("results.json", "w"))
guard.finish()
