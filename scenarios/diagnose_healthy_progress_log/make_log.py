"""Writes train.log: the console of a seed-002-like run nobody watched (tqdm bars redrawn with \\r).

    python make_log.py            # in this folder; --healthy writes the healthy twin's log

Seed 002: the scheduler was sized in micro-batches (x16) and stepped per optimizer step... the other
way round: it ended its decay after 6% of the run and the bar read `lr=0.00e+00` from then on; the
evaluation loss read 101.40 at every evaluation. The healthy twin warms up, decays with a cosine to a
floor and learns.
"""
import math
import random
import sys

healthy = "--healthy" in sys.argv
random.seed(0)
epochs, per_epoch = 3, 200
total = epochs * per_epoch
out = []
step = 0
for epoch in range(1, epochs + 1):
    for i in range(1, per_epoch + 1):
        step += 1
        if healthy:
            lr = 3e-4 * min(1.0, step / 30) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / total)))
            loss = 10.8 * math.exp(-step / 250) + 2.0 + random.uniform(-0.2, 0.2)
        else:
            lr = 3e-4 * max(0.0, 1 - step / 8) if step < 8 else 0.0
            loss = 21.5 + random.uniform(-0.1, 0.1)
        pct = int(100 * i / per_epoch)
        out.append(f"\rEpoch {epoch}/{epochs}: {pct:3d}%|{'#' * (pct // 10):<10}| {i}/{per_epoch} "
                   f"[00:{i // 60:02d}<01:00,  2.40it/s, loss={loss:.1f}, lr={lr:.2e}]")
        if step % 100 == 0:
            val = (8.0 * math.exp(-step / 300) + 2.2) if healthy else 101.40
            out.append(f"\n[Eval] step {step} loss: {val:.2f}\n")
    out.append("\n")
out.append("Training complete\n")
open("train.log", "w").write("".join(out))
