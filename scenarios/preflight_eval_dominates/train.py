"""An evaluation so frequent and so large that it would take longer than the training: every 5 steps,
over 400 batches of 256. Preflight times the eval it brings forward and warns (a warning: exit 0)."""
import torch

import trainguard

torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
val_set = [torch.randn(256, 64) for _ in range(400)]
guard = trainguard.watch(model, opt, total_steps=1000)
with guard.phase("train"):
    for step in range(1, 1001):
        x = torch.randn(32, 64)
        loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
        loss.backward(); opt.step(); opt.zero_grad()
        guard.step(loss)
        if guard.due("eval", every=5):
            with guard.phase("eval"), torch.no_grad():
                val = sum((model(v) - v.sum(1, keepdim=True)).pow(2).mean() for v in val_set) / len(val_set)
            guard.eval(loss=val)
guard.finish()
