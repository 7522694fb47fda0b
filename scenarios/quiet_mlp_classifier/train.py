"""Healthy: an MLP classifier with warmup + cosine, evaluation and checkpoints every 50 steps. Must stay quiet."""
import torch

import trainguard
from trainguard.demo.toys import MLP, clusters, minibatch, warmup_cosine

torch.manual_seed(0); torch.set_num_threads(1)
x, y = clusters(); xv, yv = clusters(512, seed=1)
gen = torch.Generator().manual_seed(0)
model = MLP()
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
steps = 300
sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(num_warmup_steps=30, num_training_steps=steps))
guard = trainguard.watch(model, opt, sched, total_steps=steps)
for step in range(1, steps + 1):
    xb, yb = minibatch(x, y, 64, gen)
    loss = torch.nn.functional.cross_entropy(model(xb), yb)
    loss.backward(); opt.step(); sched.step(); opt.zero_grad()
    guard.step(loss)
    if guard.due("eval", every=50):
        with torch.no_grad():
            val = torch.nn.functional.cross_entropy(model(xv), yv)
        guard.eval(loss=val)
        print(f"step {step}: loss {loss.item():.3f} val {val.item():.3f}")
    if guard.due("save", every=50):
        torch.save(model.state_dict(), "ckpt.pt"); guard.checkpoint_saved("ckpt.pt")
guard.finish()
