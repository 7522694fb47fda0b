"""A device-side assert on the GPU (an embedding index past the table) at step 30, under the probe.

The user's own code gets a clean Python exception; the guard must record the crash (state crashed, exit 1)
and must not turn it into a SIGABRT while it drops the device copies still in flight.
"""
import torch

import trainguard

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Embedding(64, 32), torch.nn.Linear(32, 64)).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
guard = trainguard.watch(model, opt, total_steps=100)
with guard.phase("train"):
    for step in range(1, 101):
        ids = torch.randint(0, 64, (8, 16), device="cuda")
        if step == 30:
            ids[0, 0] = 99  # out of range: a device-side assert
        logits = model(ids)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids.flatten())
        loss.backward(); opt.step(); opt.zero_grad()
        guard.step(loss)
        if step % 10 == 0:
            print(f"step {step} loss {loss.item():.3f}", flush=True)
guard.finish()
