"""Healthy, quiet set: the script prints a banner, then prepares its data for 70 s (tokenising and
packing, CPU-bound, nothing printed) before the model and the guard exist. Start-up lasts until the first
optimizer step whatever is printed before, so the default start-up grace (300 s) holds and the run must
complete with default settings (a printed line used to end the grace: stopped at 60 s).
"""
import time

import torch

print("preparing data (tokenising the corpus) ...", flush=True)
t0 = time.time()
vocab: dict[str, int] = {}
packed: list[int] = []
while time.time() - t0 < 70.0:  # 70 s of data preparation, longer than the default stall timeout (60 s)
    for word in f"the quick brown fox {len(packed) % 977} jumps over the lazy dog".split():
        packed.append(vocab.setdefault(word, len(vocab)))
    if len(packed) > 1_000_000:
        packed = packed[-1000:]

import trainguard  # noqa: E402  (imported where a script would build its model)

model = torch.nn.Linear(16, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
guard = trainguard.watch(model, opt, total_steps=30)
for step in range(1, 31):
    loss = model(torch.randn(8, 16)).pow(2).mean()
    loss.backward(); opt.step(); opt.zero_grad()
    guard.step(loss)
guard.finish()
