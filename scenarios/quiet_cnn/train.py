"""Healthy: a small CNN, a DataLoader read through guard.batches, warmup + cosine. Must stay quiet."""
import torch

import trainguard
from trainguard.demo.toys import SmallCNN, clusters, warmup_cosine

torch.manual_seed(0); torch.set_num_threads(1)
x, y = clusters(n=8192, dim=64)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=64, shuffle=True, drop_last=True)
model = SmallCNN()
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
steps = 128
sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(num_warmup_steps=10, num_training_steps=steps))
guard = trainguard.watch(model, opt, sched, total_steps=steps)
for xb, yb in guard.batches(loader):
    loss = torch.nn.functional.cross_entropy(model(xb), yb)
    loss.backward(); opt.step(); sched.step(); opt.zero_grad()
    guard.step(loss)
guard.finish()
