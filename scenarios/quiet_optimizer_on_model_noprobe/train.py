"""Healthy twin of optimizer_on_copy_noprobe: the optimizer holds the parameters of the model that trains."""
import torch

torch.manual_seed(0)
torch.set_num_threads(1)
base = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2))
optimizer = torch.optim.SGD(base.parameters(), lr=0.05, momentum=0.9)
model = base.train()  # the optimizer holds the parameters that train

for step in range(1, 201):
    xb = torch.randn(32, 16)
    yb = (xb[:, :4].sum(1) > 0).long()
    loss = torch.nn.functional.cross_entropy(model(xb), yb)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    if step % 10 == 0:
        print(f"step {step}: loss={loss.item():.4f}", flush=True)
print("done training")
