"""Healthy unmodified script (no trainguard in it) under `trainguard preflight`: relative paths only,
warmup + cosine stepped per optimizer step, accumulation 4. Preflight runs a few optimizer steps
through the automatic probe and stops it: no finding, but the verdict is `incomplete` (exit 3), never
`passed`, because its evaluation, saving and resume paths could not be brought forward."""
import os

import torch

torch.manual_seed(0)
torch.set_num_threads(1)
accum, total_steps, warmup = 4, 200, 10
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
sched = torch.optim.lr_scheduler.SequentialLR(opt, [
    torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.1, total_iters=warmup),
    torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=total_steps - warmup)], milestones=[warmup])
os.makedirs("checkpoints", exist_ok=True)
for step in range(1, total_steps + 1):
    for _ in range(accum):
        x = torch.randn(8, 16)
        ((model(x) - x.sum(1, keepdim=True)).pow(2).mean() / accum).backward()
    opt.step(); sched.step(); opt.zero_grad()
    if step % 100 == 0:
        torch.save({"model": model.state_dict(), "step": step}, "checkpoints/last.pt")
print("training complete")
