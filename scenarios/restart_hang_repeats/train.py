"""--on-hang restart: the run saves a checkpoint at step 20 and deadlocks at step 30, every time.

The first hang restarts it from the checkpoint (TRAINGUARD_RESUME_FROM, read as `guard.resume_from`);
the second hang is at the same cause and place, so trainguard stops restarting and says it repeats.
"""
import threading

import torch

import trainguard

model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
guard = trainguard.watch(model, opt, total_steps=60)
start = 1
if guard.resume_from:
    state = torch.load(guard.resume_from)
    model.load_state_dict(state["model"]); opt.load_state_dict(state["opt"])
    start = state["step"] + 1
    print(f"resumed from {guard.resume_from} at step {start} (attempt {guard.attempt})", flush=True)
registry_lock = threading.Lock()
for step in range(start, 61):
    loss = model(torch.randn(16, 8)).pow(2).mean()
    loss.backward(); opt.step(); opt.zero_grad()
    guard.step(loss)
    if step == 20:
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, "ckpt-20.pt")
        guard.checkpoint_saved("ckpt-20.pt")
    if step == 30:
        with registry_lock:
            registry_lock.acquire()  # the planted hang: re-acquiring a lock this thread holds
guard.finish()
