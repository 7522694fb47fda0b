"""An evaluation interval longer than the run: eval every 5000 steps in a 1000-step run never happens."""
import torch

import trainguard

torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Linear(16, 1)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
guard = trainguard.watch(model, opt, total_steps=1000)
with guard.phase("train"):
    for step in range(1, 1001):
        x = torch.randn(8, 16)
        loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
        loss.backward(); opt.step(); opt.zero_grad()
        guard.step(loss)
        if guard.due("eval", every=5000):
            with guard.phase("eval"), torch.no_grad():
                guard.eval(loss=(model(x) - x.sum(1, keepdim=True)).pow(2).mean())
guard.finish()
