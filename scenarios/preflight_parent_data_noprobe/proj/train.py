"""Preflight on an unmodified script that reads its data from `../data` (the layout of many projects: code
in one folder, data beside it) and saves its checkpoints into a fresh `tempfile.mkdtemp()` folder.

Issue 31 (item 9): the scratch folder resolved `../data` inside itself, the script crashed on line 1 of its
work, and the summary said it "does not call trainguard.watch()". The script's view of the file system is
kept now: `../data` is the user's `../data`; the mkdtemp folder is the script's own scratch (no TG608).
"""
import csv
import os
import tempfile

import torch

rows = list(csv.reader(open("../data/points.csv")))  # relative to the folder it is run from, as in the real run
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
