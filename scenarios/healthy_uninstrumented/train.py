"""Healthy twin without the probe: plain torch, progress printed. Must complete quietly."""
import torch

torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(1, 301):
    x = torch.randn(32, 32)
    y = (x[:, 0] > 0).long()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward(); opt.step(); opt.zero_grad()
    if step % 50 == 0:
        print(f"step {step} loss={loss.item():.4f}", flush=True)
open("model.txt", "w").write("done\n")
