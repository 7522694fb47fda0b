"""A checkpoint that saves but cannot be loaded back: the wrapped model (DataParallel here, DDP or
torch.compile alike) is saved with `module.`-prefixed keys, and the resume code loads into the bare model."""
import torch

import trainguard

torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
guard = trainguard.watch(model, opt, total_steps=2000)
start = 0
if guard.resume_from:
    state = torch.load(guard.resume_from)
    model.load_state_dict(state["model"])  # the bare model: keys "0.weight", not "module.0.weight"
    opt.load_state_dict(state["opt"])
    start = state["step"]
wrapped = torch.nn.DataParallel(model)  # what trains (on GPUs: DDP, or torch.compile's _orig_mod.)
with guard.phase("train"):
    for step in range(start + 1, 2001):
        x = torch.randn(8, 16)
        loss = (wrapped(x) - x.sum(1, keepdim=True)).pow(2).mean()
        loss.backward(); opt.step(); opt.zero_grad()
        guard.step(loss)
        if guard.due("save", every=500):
            torch.save({"model": wrapped.state_dict(), "opt": opt.state_dict(), "step": step}, "last.pt")
            guard.checkpoint_saved("last.pt")
guard.finish()
