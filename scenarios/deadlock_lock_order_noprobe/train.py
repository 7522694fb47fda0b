"""Without the probe (py-spy takes the stacks, output lines are progress). A lock-order deadlock: the training loop takes `stats` then `ckpt`; a helper thread takes `ckpt` then `stats`.

At step 30 the helper (an asynchronous checkpoint uploader) and the loop each grab their first lock and
wait forever for the other's.
"""
import threading
import time

import torch

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
for step in range(1, 101):
    loss = model(torch.randn(16, 8)).pow(2).mean()
    loss.backward(); opt.step(); opt.zero_grad()
    print(f"step {step} loss {loss.item():.4f}", flush=True)
    if step == 30:
        threading.Thread(target=uploader, name="uploader", daemon=True).start()
        helper_has_ckpt.wait()
    with stats_lock:
        with ckpt_lock:  # the planted deadlock: lock order stats -> ckpt here, ckpt -> stats in uploader
            pass
print("done")
