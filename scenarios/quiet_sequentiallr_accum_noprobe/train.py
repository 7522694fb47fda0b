"""Healthy, unmodified (no trainguard in it): warmup then cosine through SequentialLR, stepped once per
optimizer step, gradient accumulation, an evaluation every 40 steps. The twin of
sched_per_microbatch_noprobe; under `trainguard run` it must stay quiet.
"""
import torch
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
torch.set_num_threads(1)
grad_accum = 4
epochs = 2
x = torch.randn(1920, 16)
y = (x[:, :4].sum(1) > 0).long()
train = DataLoader(TensorDataset(x[:1600], y[:1600]), batch_size=8, shuffle=True)
val = DataLoader(TensorDataset(x[1600:], y[1600:]), batch_size=64)
total_steps = len(train) * epochs // grad_accum  # 100 optimizer steps
warmup = 10

model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2))
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
scheduler = torch.optim.lr_scheduler.SequentialLR(optimizer, [
    torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=0.1, total_iters=warmup),
    torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=total_steps - warmup, eta_min=1e-5),
], milestones=[warmup])


def evaluate():
    model.eval()
    with torch.no_grad():
        losses = [torch.nn.functional.cross_entropy(model(xb), yb).item() for xb, yb in val]
    model.train()
    return sum(losses) / len(losses)


step = 0
for epoch in range(epochs):
    for i, (xb, yb) in enumerate(train):
        loss = torch.nn.functional.cross_entropy(model(xb), yb)
        (loss / grad_accum).backward()
        if (i + 1) % grad_accum == 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            step += 1
            if step % 5 == 0:
                print(f"step {step} | loss {loss.item():.4f} | lr {scheduler.get_last_lr()[0]:.6e}", flush=True)
            if step % 40 == 0:
                print(f"[Eval] step {step} val_loss: {evaluate():.4f}", flush=True)
print("training complete")
