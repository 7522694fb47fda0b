"""Healthy, unmodified script whose evaluation (no phase marked, no progress printed) takes ~12 s of torch
compute while the stall timeout is 4 s. Issue 31: a healthy 68 s evaluation was labelled `busy-loop`. The
evaluation runs a frozen scorer network, not the model trained (whose forwards the zero-code probe now sees
as progress: quiet_long_eval_forwards_noprobe): the stall is reported (nothing said the run was
evaluating), but named for what the stacks show: it computes inside torch, called from `evaluate`; no spin,
no stop.
"""
import time

import torch

torch.manual_seed(0); torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
scorer = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10)).requires_grad_(False)


def evaluate(seconds: float) -> float:
    """The share of samples a frozen scorer network (an Inception-style judge, not the model trained) puts in
    class 0, over a long evaluation set."""
    correct = total = 0
    end = time.time() + seconds
    with torch.no_grad():
        while time.time() < end:  # a long evaluation set, batch after batch
            xb = torch.randn(4096, 256)
            out = scorer(xb)
            correct += int((out.argmax(1) == 0).sum()); total += len(xb)
    return correct / total


for step in range(1, 61):
    x = torch.randn(64, 256)
    loss = torch.nn.functional.cross_entropy(model(x), (x[:, 0] > 0).long())
    loss.backward(); opt.step(); opt.zero_grad()
    if step % 10 == 0:
        print(f"step {step} loss={loss.item():.4f}", flush=True)
    if step == 30:
        print(f"eval accuracy {evaluate(12.0):.3f}", flush=True)
