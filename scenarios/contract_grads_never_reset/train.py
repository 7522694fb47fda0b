"""A training loop without `optimizer.zero_grad()` (TG213 grads-never-reset).

Modelled on Stack Overflow question 60335387, one of the silent bugs TrainCheck reproduced ("Missing call
to `optimizer.zero_grad`" in its bug list): the loop is written the Keras way, and each `backward()` adds
to the gradients of every earlier batch.
"""
import torch
from torch import nn

import trainguard

torch.manual_seed(0); torch.set_num_threads(1)
x = torch.randn(2048, 8)
y = x @ torch.randn(8, 1) + 0.1 * torch.randn(2048, 1)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=64, shuffle=True)
model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
epochs = 2
guard = trainguard.watch(model, opt, total_steps=epochs * len(loader))
for epoch in range(epochs):
    for xb, yb in guard.batches(loader):
        loss = nn.functional.mse_loss(model(xb), yb)
        loss.backward()
        opt.step()  # the bug: no opt.zero_grad() anywhere
        guard.step(loss)
guard.finish()
