"""The health rules run on what the preflight recorded: a loss that is NaN from the first step (the log
of a negative number) is named in the preflight's few seconds, as it would be in the real run."""
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
        loss = torch.log(model(x) - 100).mean()  # log of a negative number: NaN from the first step
        loss.backward(); opt.step(); opt.zero_grad()
        guard.step(loss)
        if guard.due("eval", every=200):
            with guard.phase("eval"), torch.no_grad():
                guard.eval(loss=torch.log(model(x) - 100).mean())
guard.finish()
