"""nanoGPT's way: no scheduler, the LR set by hand in param_groups from get_lr(iter_num) before each
step. Here lr_decay_iters was left at 60 from a shorter run while max_iters is 240, and min_lr is 0:
from iteration 60 on the LR is 0 for three quarters of the run. The healthy twin (sched_hand_lr_ok)
decays over the whole run to a tenth of the peak."""
import math
import sys

import torch

import trainguard
from trainguard.demo.toys import MLP, clusters, minibatch

# -----------------------------------------------------------------------------
learning_rate = 3e-3  # max learning rate
max_iters = 240  # total number of training iterations
warmup_iters = 10  # how many steps to warm up for
lr_decay_iters = max_iters if "--whole-run" in sys.argv else 60  # the bug: left from a shorter run
min_lr = learning_rate / 10 if "--whole-run" in sys.argv else 0.0  # minimum learning rate
# -----------------------------------------------------------------------------


def get_lr(it):
    # 1) linear warmup for warmup_iters steps
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    # 2) if it > lr_decay_iters, return min learning rate
    if it > lr_decay_iters:
        return min_lr
    # 3) in between, use cosine decay down to min learning rate
    decay_ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))  # coeff ranges 0..1
    return min_lr + coeff * (learning_rate - min_lr)


torch.manual_seed(0); torch.set_num_threads(1)
x, y = clusters()
gen = torch.Generator().manual_seed(0)
model = MLP()
optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate)
guard = trainguard.watch(model, optimizer, total_steps=max_iters)
for iter_num in range(max_iters):
    lr = get_lr(iter_num)
    for param_group in optimizer.param_groups:
        param_group["lr"] = lr
    xb, yb = minibatch(x, y, 32, gen)
    loss = torch.nn.functional.cross_entropy(model(xb), yb)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    guard.step(loss)
guard.finish()
