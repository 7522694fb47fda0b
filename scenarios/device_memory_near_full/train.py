"""Seed 002's memory: the device is 97% full while the run trains (a block held on the side fills it)."""
import time

import torch

import trainguard
from trainguard.demo.toys import MLP, clusters

torch.manual_seed(0)
dev = torch.device("cuda")
free, total = torch.cuda.mem_get_info()
ballast = torch.empty(int(free - 0.03 * total), dtype=torch.uint8, device=dev)  # activations kept "for later"
x, y = clusters(); x, y = x.to(dev), y.to(dev)
gen = torch.Generator(device=dev).manual_seed(0)
model = MLP().to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
steps = 300
guard = trainguard.watch(model, opt, total_steps=steps)
for step in range(1, steps + 1):
    idx = torch.randint(len(x), (64,), device=dev, generator=gen)
    loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
    loss.backward(); opt.step(); opt.zero_grad()
    guard.step(loss)
    time.sleep(0.02)
guard.finish()
