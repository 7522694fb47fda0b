"""Without the probe: a checkpoint write that blocks forever, in a script nobody changed.

The checkpoint path is a FIFO nobody reads (a file system that stopped answering, as a hung NFS mount):
`torch.save` opens it for writing and the open never returns. The stacks come from the bootstrap's
signal dump (no py-spy, no ptrace needed).
"""
import os

import torch

os.makedirs("ckpt", exist_ok=True)
if not os.path.exists("ckpt/last.pt"):
    os.mkfifo("ckpt/last.pt")  # the unresponsive "file system"

model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(1, 101):
    loss = model(torch.randn(16, 8)).pow(2).mean()
    loss.backward(); opt.step(); opt.zero_grad()
    if step % 10 == 0:
        print(f"step {step} loss={loss.item():.4f}", flush=True)
    if step % 50 == 0:
        torch.save({"model": model.state_dict(), "step": step}, "ckpt/last.pt")  # the planted hang
print("training complete")
