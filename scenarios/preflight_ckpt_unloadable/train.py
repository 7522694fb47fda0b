"""A checkpoint that saves but cannot be loaded back: it holds the run's config object, which
torch.load (weights_only=True, the default since torch 2.6) refuses to unpickle."""
from dataclasses import dataclass

import torch

import trainguard


@dataclass
class Config:
    lr: float = 1e-3
    steps: int = 2000


cfg = Config()
torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Linear(16, 1)
opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
guard = trainguard.watch(model, opt, total_steps=cfg.steps)
start = 0
if guard.resume_from:
    state = torch.load(guard.resume_from)
    model.load_state_dict(state["model"]); opt.load_state_dict(state["opt"])
    start = state["step"]
with guard.phase("train"):
    for step in range(start + 1, cfg.steps + 1):
        x = torch.randn(8, 16)
        loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
        loss.backward(); opt.step(); opt.zero_grad()
        guard.step(loss)
        if guard.due("save", every=500):
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step, "config": cfg},
                       "last.pt")
            guard.checkpoint_saved("last.pt")
guard.finish()
