"""Hang twin of quietset_first_eval_unmarked: a first evaluation longer than the stall timeout (forwards
only, no marks), then a real deadlock in the metric gathering: the loop takes `metrics` then `ckpt`, the
uploader thread `ckpt` then `metrics`. The long evaluation must not be stopped; the deadlock after it must
be found and stopped (a lock cycle is proof).
"""
import threading
import time

import torch

import trainguard

metrics_lock = threading.Lock()
ckpt_lock = threading.Lock()
uploader_has_ckpt = threading.Event()


def uploader() -> None:
    with ckpt_lock:
        uploader_has_ckpt.set()
        time.sleep(0.2)
        with metrics_lock:  # waits for the loop, which waits for us
            pass


model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
guard = trainguard.watch(model, opt, total_steps=40)
for step in range(1, 41):
    loss = model(torch.randn(16, 64)).pow(2).mean()
    loss.backward(); opt.step(); opt.zero_grad()
    guard.step(loss)
    if step == 20:
        with guard.phase("eval"), torch.no_grad():
            total = 0.0
            for x in torch.randn(40, 1, 64):
                total += model(x).pow(2).mean().item()
                time.sleep(0.3)  # 12 s of evaluation, three times the stall timeout
            threading.Thread(target=uploader, name="uploader", daemon=True).start()
            uploader_has_ckpt.wait()
            with metrics_lock:
                with ckpt_lock:  # the planted deadlock
                    guard.eval(loss=total / 40)
guard.finish()
