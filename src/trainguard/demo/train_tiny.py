"""The demo run: a tiny transformer LM trained on the CPU with the probe, evaluated every 100 steps.

    trainguard run -- python -m trainguard.demo.train_tiny --steps 300
"""

from __future__ import annotations

import argparse
import json
import os

import torch

import trainguard
from trainguard.demo.tinylm import TinyLM, batch, corpus, cosine_with_warmup

parser = argparse.ArgumentParser(description=__doc__)
parser.add_argument("--steps", type=int, default=300, help="optimizer steps")
parser.add_argument("--grad-accum", type=int, default=2, help="micro-batches per optimizer step")
parser.add_argument("--batch-size", type=int, default=8)
parser.add_argument("--eval-every", type=int, default=100, help="optimizer steps between evaluations")
parser.add_argument("--out", default="demo-results.json", help="where the final metrics are written")
parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: up to 2, as the CPU allows)")
args = parser.parse_args()

torch.manual_seed(0)
torch.set_num_threads(args.threads or max(1, min(2, os.cpu_count() or 1)))
gen = torch.Generator().manual_seed(0)
data = corpus()
split = int(0.9 * len(data))
train_data, val_data = data[:split], data[split:]

model = TinyLM()
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
scheduler = cosine_with_warmup(optimizer, warmup=20, total=args.steps)
guard = trainguard.watch(model, optimizer, scheduler, total_steps=args.steps, grad_accum=args.grad_accum)


@torch.no_grad()
def evaluate() -> float:
    model.eval()
    losses = []
    for _ in range(10):
        x, y = batch(val_data, args.batch_size, model.ctx, gen)
        logits = model(x)
        losses.append(torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten()).item())
    model.train()
    return sum(losses) / len(losses)


step = 0
with guard.phase("train"):
    while step < args.steps:
        for _ in range(args.grad_accum):
            x, y = batch(train_data, args.batch_size, model.ctx, gen)
            loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
            (loss / args.grad_accum).backward()
            guard.step(loss)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        if guard.due("eval", every=args.eval_every):
            with guard.phase("eval"):
                val = evaluate()
            guard.eval(loss=val)
            print(f"step {step}: val loss {val:.3f}", flush=True)

with open(args.out, "w") as fh:
    json.dump({"steps": step, "val_loss": evaluate()}, fh)
guard.finish()
