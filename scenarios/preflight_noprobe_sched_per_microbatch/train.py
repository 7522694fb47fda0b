"""An unmodified script (no trainguard in it) whose linear decay schedule is sized in optimizer steps but stepped
once per micro-batch (accumulation 8). Preflight, through the automatic probe, sees the scheduler
stepped 8 times per optimizer step and simulates it over the scheduler's own horizon: the LR is done an
eighth of the way in."""
import torch

torch.manual_seed(0)
torch.set_num_threads(1)
accum, total_steps = 8, 200
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
sched = torch.optim.lr_scheduler.LinearLR(opt, start_factor=1.0, end_factor=0.0,
                                          total_iters=total_steps)  # sized in optimizer steps
for step in range(1, total_steps + 1):
    for _ in range(accum):
        x = torch.randn(8, 16)
        ((model(x) - x.sum(1, keepdim=True)).pow(2).mean() / accum).backward()
        sched.step()  # BUG: per micro-batch
    opt.step(); opt.zero_grad()
print("training complete")
