"""Zero-code: the evaluation scores a copy of the model taken before training, printed the way the PyTorch
CIFAR-10 tutorial prints it ("Accuracy of the network on the ... : N %"). The number never moves.

Modelled on the reports of an accuracy "stuck at the same value every epoch" where the evaluated model was
not the trained one (a deepcopy made before the loop, discuss.pytorch.org "validation accuracy not changing").
"""
import copy

import torch

torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
best = copy.deepcopy(model)  # the bug: the evaluation below uses this copy, never updated
opt = torch.optim.SGD(model.parameters(), lr=0.1)
xv = torch.randn(512, 16)
yv = xv[:, :4].argmax(1)
for step in range(1, 201):
    x = torch.randn(64, 16)
    y = x[:, :4].argmax(1)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward(); opt.step(); opt.zero_grad()
    if step % 10 == 0:
        print(f"step {step} loss={loss.item():.4f}", flush=True)
    if step % 20 == 0:  # ten evaluations: a rounded result must repeat ten times while training moves
        with torch.no_grad():
            acc = (best(xv).argmax(1) == yv).float().mean().item() * 100
        print(f"Accuracy of the network on the validation set: {acc:.1f} %", flush=True)
