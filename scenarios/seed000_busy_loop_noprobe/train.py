"""Seed 000 without the probe: the baseline phase prints its progress, then a component's initialisation
spins forever. Output lines are the only progress; py-spy takes the stacks.
"""
import torch

model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)


class InferenceScalingEngine:
    def __init__(self) -> None:
        self.ready = False
        while not self.ready:  # the planted busy loop: waits for a flag nothing will ever set
            pass


for step in range(1, 101):
    loss = model(torch.randn(16, 8)).pow(2).mean()
    loss.backward(); opt.step(); opt.zero_grad()
    if step % 10 == 0:
        print(f"baseline step {step} loss {loss.item():.4f}", flush=True)
print("baseline complete", flush=True)
engine = InferenceScalingEngine()
print("optimized complete", flush=True)
