"""Hang twin of quietset_first_eval_unmarked, default settings: a 66 s first evaluation (forwards only, no
marks), longer than the default stall timeout (60 s), then a real deadlock in the metric gathering: the loop
takes `metrics` then `ckpt`, the uploader thread `ckpt` then `metrics`. What it proves: the long evaluation
is not stopped (forwards of the watched model are progress); the deadlock after it is found at the stall
timeout within 15 s and stopped at once (a lock cycle is proof).
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
    time.sleep(0.02)
    if step == 20:
        with guard.phase("eval"), torch.no_grad():
            total = 0.0
            for x in torch.randn(200, 1, 64):
                total += model(x).pow(2).mean().item()
                time.sleep(0.33)  # 200 x 0.33 s = 66 s of evaluation, longer than the stall timeout
            threading.Thread(target=uploader, name="uploader", daemon=True).start()
            uploader_has_ckpt.wait()
            with metrics_lock:
                with ckpt_lock:  # the planted deadlock
                    guard.eval(loss=total / 200)
guard.finish()
