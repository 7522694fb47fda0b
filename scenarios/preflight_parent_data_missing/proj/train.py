"""Failing twin of preflight_parent_data_noprobe: the same script reads `../data/point.csv`, a file that does
not exist beside it (a typo for points.csv). The preflight must crash where the real run would, at the
line that opens it, and say so: not that the script "does not call trainguard.watch()".
"""
import csv
import os
import tempfile

import torch

rows = list(csv.reader(open("../data/point.csv")))  # relative to the folder it is run from, as in the real run
x = torch.tensor([[float(v) for v in r[:4]] for r in rows])
y = torch.tensor([int(r[4]) for r in rows])
torch.manual_seed(0); torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
out = tempfile.mkdtemp(prefix="ckpt-")  # its own fresh folder
for step in range(1, 201):
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward(); opt.step(); opt.zero_grad()
    if step % 50 == 0:
        torch.save(model.state_dict(), os.path.join(out, f"step{step}.pt"))
        print(f"step {step} loss={loss.item():.4f}", flush=True)
