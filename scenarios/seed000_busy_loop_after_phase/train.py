"""Seed 000: train_baseline() completes, then train_optimized()'s component initialisation spins forever.

The process burns CPU (seed 000 showed 4466%) and makes no progress: CPU is not progress.
"""
import torch

import trainguard

model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
guard = trainguard.watch(model, opt, total_steps=100)


class InferenceScalingEngine:
    def __init__(self) -> None:
        self.ready = False
        while not self.ready:  # waits for a flag nothing will ever set
            pass


with guard.phase("baseline"):
    for _ in range(100):
        loss = model(torch.randn(16, 8)).pow(2).mean()
        loss.backward(); opt.step(); opt.zero_grad()
        guard.step(loss)
print("baseline complete", flush=True)
with guard.phase("optimized"):
    engine = InferenceScalingEngine()
guard.finish()
