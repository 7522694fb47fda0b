"""A lock-order deadlock: the training loop takes `stats` then `ckpt`; a helper thread takes `ckpt` then `stats`.

At step 30 the helper (an asynchronous checkpoint uploader) and the loop each grab their first lock and
wait forever for the other's.
"""
import threading
import time

import torch

import trainguard

stats_lock = threading.Lock()
ckpt_lock = threading.Lock()
helper_has_ckpt = threading.Event()


def uploader() -> None:
    with ckpt_lock:
        helper_has_ckpt.set()
        time.sleep(0.2)
        with stats_lock:  # waits for the loop, which waits for us
            pass


model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
guard = trainguard.watch(model, opt, total_steps=100)
for step in range(1, 101):
    loss = model(torch.randn(16, 8)).pow(2).mean()
    loss.backward(); opt.step(); opt.zero_grad()
    guard.step(loss)
    if step == 30:
        threading.Thread(target=uploader, name="uploader", daemon=True).start()
        helper_has_ckpt.wait()
    with stats_lock:
        with ckpt_lock:  # the planted deadlock: lock order stats -> ckpt here, ckpt -> stats in uploader
            pass
guard.finish()
