"""Seed 000: the monitor said "Training complete" but phase3_stage3a_comparison.json was never written.

train_baseline() finishes; train_optimized() returns early without its comparison; the script exits 0.
"""
import torch

import trainguard

model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
guard = trainguard.watch(model, opt, total_steps=40)


def train_baseline() -> None:
    with guard.phase("baseline"):
        for _ in range(40):
            loss = model(torch.randn(16, 8)).pow(2).mean()
            loss.backward(); opt.step(); opt.zero_grad()
            guard.step(loss)


def train_optimized() -> dict | None:
    with guard.phase("optimized"):
        return None  # the "optimization stack" silently does nothing


train_baseline()
result = train_optimized()
if result is not None:
    import json
    json.dump(result, open("phase3_stage3a_comparison.json", "w"))
print("Training complete")
guard.finish()
