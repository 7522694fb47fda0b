"""An unmodified script (no trainguard in it) under `trainguard preflight`: it resumes from and saves to
`checkpoints/last.pt` (which exists from an earlier run), through a path anchored at its own file (so
the scratch folder's copy-on-write cannot catch it), saves every 5 steps and evaluates every 100.
Preflight cannot fast-forward it: it runs optimizer steps through the automatic probe, refuses the save
that would overwrite the existing checkpoint (the script stops there), lists what it could not
exercise, and the user's checkpoint keeps its bytes (tests/test_preflight_noprobe.py checks them)."""
import os
from pathlib import Path

import torch

CKPT = Path(__file__).resolve().parent / "checkpoints" / "last.pt"
torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Linear(16, 1)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=400)
start = 0
if os.path.exists(CKPT) and os.path.getsize(CKPT) > 100:
    state = torch.load(CKPT)
    model.load_state_dict(state["model"]); start = state["step"]
with open("train_log.txt", "w") as log:
    for step in range(start + 1, 401):
        x = torch.randn(8, 16)
        loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
        loss.backward(); opt.step(); sched.step(); opt.zero_grad()
        log.write(f"step {step} loss {loss.item():.4f}\n")
        if step % 5 == 0:
            torch.save({"model": model.state_dict(), "step": step}, CKPT)
        if step % 100 == 0:
            print(f"[Eval] step {step} loss: {loss.item():.4f}", flush=True)
print("training complete")
