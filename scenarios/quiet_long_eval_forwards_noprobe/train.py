"""Healthy, unmodified script whose evaluation (no phase marked, no progress printed) runs the model's forward
batch after batch for ~12 s while the stall timeout is 4 s (the twin of stall_long_eval_computing_noprobe).
Under `trainguard run` with no code change the probe finds the model through torch's global module hooks;
its forwards are progress, as under `watch(model)`: no stall, no finding.
"""
import time

import torch

torch.manual_seed(0); torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.05)


def evaluate(seconds: float) -> float:
    model.eval()
    correct = total = 0
    end = time.time() + seconds
    with torch.no_grad():
        while time.time() < end:  # a long evaluation set, batch after batch
            xb = torch.randn(4096, 256)
            out = model(xb)
            correct += int((out.argmax(1) == 0).sum()); total += len(xb)
    model.train()
    return correct / total


for step in range(1, 61):
    x = torch.randn(64, 256)
    loss = torch.nn.functional.cross_entropy(model(x), (x[:, 0] > 0).long())
    loss.backward(); opt.step(); opt.zero_grad()
    if step % 10 == 0:
        print(f"step {step} loss={loss.item():.4f}", flush=True)
    if step == 30:
        print(f"eval accuracy {evaluate(12.0):.3f}", flush=True)
