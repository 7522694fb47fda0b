"""An unmodified script (no trainguard in it) whose LR scheduler is stepped once per micro-batch.

The schedule (linear warmup, then linear decay to 0, the Hugging Face shape) is sized in optimizer
steps, but `scheduler.step()` sits inside the accumulation loop, so it runs 8 times per optimizer step:
the LR reaches 0 an eighth of the way in and the remaining 7/8 of the run trains with LR 0.
"""
import torch
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
torch.set_num_threads(1)
grad_accum = 8
epochs = 2
x = torch.randn(1920, 16)
y = (x[:, :4].sum(1) > 0).long()
loader = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True)
total_steps = len(loader) * epochs // grad_accum  # optimizer steps: 120
warmup = 6

model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
scheduler = torch.optim.lr_scheduler.LambdaLR(
    optimizer, lambda s: min((s + 1) / warmup, max(0.0, (total_steps - s) / (total_steps - warmup))))

step = 0
for epoch in range(epochs):
    for i, (xb, yb) in enumerate(loader):
        loss = torch.nn.functional.cross_entropy(model(xb), yb)
        (loss / grad_accum).backward()
        scheduler.step()  # BUG: once per micro-batch; the schedule counts optimizer steps
        if (i + 1) % grad_accum == 0:
            optimizer.step()
            optimizer.zero_grad()
            step += 1
            if step % 5 == 0:
                print(f"step {step} | loss {loss.item():.4f} | lr {scheduler.get_last_lr()[0]:.6e}", flush=True)
print("training complete")
