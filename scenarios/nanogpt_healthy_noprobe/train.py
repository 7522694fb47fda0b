"""nanoGPT-shaped training loop, unmodified (no trainguard in it): the healthy twin of
nanogpt_nan_loss_noprobe (no padding stretch in its data). Warmup then cosine, evals, printed loss.
"""
import math
import time

import torch
import torch.nn as nn
from torch.nn import functional as F

# -----------------------------------------------------------------------------
batch_size = 8
block_size = 16
vocab_size = 64
n_embd = 32
learning_rate = 3e-3  # max learning rate
max_iters = 400
warmup_iters = 20
lr_decay_iters = 400  # should be ~= max_iters per Chinchilla
min_lr = 3e-4
log_interval = 5
eval_interval = 100
padding_stretch = (0, 0)  # no corrupt shard: the healthy twin
# -----------------------------------------------------------------------------

torch.manual_seed(1337)
torch.set_num_threads(1)
tokens = torch.randint(0, vocab_size, (max_iters + 10, batch_size, block_size + 1))
tokens[padding_stretch[0]:padding_stretch[1], :, 1:] = -1  # a corrupt shard: every target is padding


def get_batch(it):
    chunk = tokens[it]
    x, y = chunk[:, :-1].clamp(min=0), chunk[:, 1:]
    return x, y


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd))
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)

    def forward(self, idx, targets=None):
        x = self.wte(idx)
        x = x + self.mlp(x)
        logits = self.lm_head(x)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1)
        return logits, loss


def get_lr(it):
    # 1) linear warmup for warmup_iters steps
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    # 2) if it > lr_decay_iters, return min learning rate
    if it > lr_decay_iters:
        return min_lr
    # 3) in between, use cosine decay down to min learning rate
    decay_ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))
    return min_lr + coeff * (learning_rate - min_lr)


@torch.no_grad()
def estimate_loss():
    model.eval()
    losses = torch.zeros(4)
    for k in range(4):
        X, Y = get_batch(max_iters + k)
        _, loss = model(X, Y)
        losses[k] = loss.item()
    model.train()
    return losses.mean()


model = TinyLM()
optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=0.1)
X, Y = get_batch(0)
t0 = time.time()
iter_num = 0
while True:
    lr = get_lr(iter_num)
    for param_group in optimizer.param_groups:
        param_group["lr"] = lr
    if iter_num % eval_interval == 0 and iter_num > 0:
        print(f"step {iter_num}: val loss {estimate_loss():.4f}")
    logits, loss = model(X, Y)
    X, Y = get_batch(iter_num + 1)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    t1 = time.time()
    dt = t1 - t0
    t0 = t1
    if iter_num % log_interval == 0:
        lossf = loss.item()
        print(f"iter {iter_num}: loss {lossf:.4f}, time {dt*1000:.2f}ms, mfu -100.00%")
    iter_num += 1
    if iter_num > max_iters:
        break
