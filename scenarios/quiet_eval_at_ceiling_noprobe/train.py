"""Healthy twin of eval_frozen_printed_noprobe: the trained model itself is evaluated, on a task it solves.

From the second evaluation on its accuracy is 100.0 % every time: a metric at its ceiling is finished, not
frozen, and must not be reported as `eval-metrics-frozen` (the loss keeps falling).
"""
import torch

torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.2)
xv = torch.randn(256, 16)
yv = (xv[:, 0] > 0).long()
xv = xv + torch.sign(xv[:, :1]) * 2 * torch.nn.functional.one_hot(torch.zeros(256, dtype=torch.long), 16)
for step in range(1, 201):
    x = torch.randn(64, 16)
    y = (x[:, 0] > 0).long()
    x = x + torch.sign(x[:, :1]) * 2 * torch.nn.functional.one_hot(torch.zeros(64, dtype=torch.long), 16)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward(); opt.step(); opt.zero_grad()
    if step % 10 == 0:
        print(f"step {step} loss={loss.item():.4f}", flush=True)
    if step % 40 == 0:
        model.eval()
        with torch.no_grad():
            acc = (model(xv).argmax(1) == yv).float().mean().item() * 100
        model.train()
        print(f"Accuracy of the network on the validation set: {acc:.1f} %", flush=True)
