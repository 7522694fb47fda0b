"""Writes train.log: nanoGPT's console for a small character model trained far past its best evaluation.

    python make_log.py            # in this folder; --healthy writes the twin (a plateau that creeps up a little)

nanoGPT's train.py prints `step N: train loss X, val loss Y` at every eval_interval and `iter N: loss X, time
...ms, mfu ...%` every log_interval; with always_save_checkpoint=False it saves only on a new best
validation loss. A model far too big for its data memorises it: the training loss keeps falling while the
validation loss doubles from its best (shakespeare_char at 5,000 iterations).
"""
import math
import random
import sys

healthy = "--healthy" in sys.argv
random.seed(5)
max_iters, eval_interval, log_interval = 5000, 250, 10
out = [f"Overriding: max_iters = {max_iters}", "tokens per iteration will be: 16,384",
       "number of parameters: 10.65M"]
best = float("inf")
for it in range(0, max_iters + 1):
    train = 4.2 * math.exp(-it / 300) + (0.9 if healthy else 1.2) * math.exp(-it / 2500) + (0.8 if healthy else 0.05)
    if it % eval_interval == 0:
        if healthy:
            val = 4.2 * math.exp(-it / 300) + 1.45 + 0.05 * it / max_iters
        else:
            val = 4.2 * math.exp(-it / 300) + 1.5 + max(0.0, (it - 1250) / 1250) * 0.9
        out.append(f"step {it}: train loss {train:.4f}, val loss {val:.4f}")
        if val < best:
            best = val
            out.append("saving checkpoint to out-shakespeare-char")
    if it % log_interval == 0:
        out.append(f"iter {it}: loss {train * random.uniform(0.97, 1.03):.4f}, time {57 + random.random():.2f}ms, "
                   f"mfu {6 + random.random():.2f}%")
with open("train.log", "w") as f:
    f.write("\n".join(out) + "\n")
