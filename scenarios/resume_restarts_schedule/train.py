"""A run restarted from its checkpoint whose LR schedule starts over: the checkpoint holds the model and the
optimizer, not the scheduler (the resume bug of many hand-written loops; huggingface/transformers#7198 asked
the Trainer to restore it too). Warm-up 100 steps to 1e-3 (LinearLR), then cosine; a checkpoint every 50 steps.

Attempt 0 deadlocks once at step 130 (a lock taken twice: a proven hang); `trainguard run --on-hang restart`
starts it again from the step-100 checkpoint. The resumed run calls `guard.set_step(100)` and loads the
optimizer, whose LR is restored, but its fresh scheduler is back in its warm-up: LinearLR multiplies the
restored LR again at every step, 5x the plan by step 105 and 30x by step 130. Nothing fails.
"""
import os
import threading

import torch

import trainguard
from trainguard.demo.toys import MLP, clusters, minibatch

KEEP_SCHEDULE = os.environ.get("ZOO_KEEP_SCHEDULE") == "1"
torch.manual_seed(0); torch.set_num_threads(1)
x, y = clusters()
gen = torch.Generator().manual_seed(0)
model = MLP()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
steps, warmup = 300, 100
sched = torch.optim.lr_scheduler.SequentialLR(opt, [
    torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.01, total_iters=warmup),
    torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps - warmup)], milestones=[warmup])
guard = trainguard.watch(model, opt, sched, total_steps=steps)
start = 1
if guard.resume_from:
    state = torch.load(guard.resume_from)
    model.load_state_dict(state["model"]); opt.load_state_dict(state["opt"])
    if KEEP_SCHEDULE:
        sched.load_state_dict(state["sched"])
    guard.set_step(state["step"])
    start = state["step"] + 1
lock = threading.Lock()
for step in range(start, steps + 1):
    xb, yb = minibatch(x, y, 64, gen)
    loss = torch.nn.functional.cross_entropy(model(xb), yb)
    loss.backward(); opt.step(); sched.step(); opt.zero_grad()
    guard.step(loss)
    if step % 50 == 0:
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict(),
                    "step": step}, f"ckpt-{step}.pt")
        guard.checkpoint_saved(f"ckpt-{step}.pt")
    if step == 130 and guard.attempt == 0:
        with lock:
            lock.acquire()  # the one-off hang that gets the run restarted
    if step == 160:
        break  # enough to see it; the planned length stays 300
guard.finish()
