"""Checkpoints anchored at the script's own file (`Path(__file__).resolve().parent / "checkpoints"`): the
preflight's checkpoint lands in the project's real checkpoint folder, where the real run would resume
from it. Preflight names the file (a warning: the script itself is sound)."""
from pathlib import Path

import torch

import trainguard

CKPT = Path(__file__).resolve().parent / "checkpoints"
torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Linear(16, 1)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
guard = trainguard.watch(model, opt, total_steps=1000)
if guard.resume_from:
    model.load_state_dict(torch.load(guard.resume_from)["model"])
CKPT.mkdir(exist_ok=True)
with guard.phase("train"):
    for step in range(1, 1001):
        x = torch.randn(8, 16)
        loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
        loss.backward(); opt.step(); opt.zero_grad()
        guard.step(loss)
        if guard.due("save", every=250):
            torch.save({"model": model.state_dict()}, CKPT / "last.pt")
            guard.checkpoint_saved(CKPT / "last.pt")
guard.finish()
