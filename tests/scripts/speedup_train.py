"""A tiny LM trained two ways for `trainguard compare`: `--variant baseline` or `--variant fast`.

The baseline does what slow scripts often do: extra forward passes each step, under no_grad, to log
"clean" losses that nothing needs. The fast variant drops them. Both consume the same random numbers,
so they train identically and converge the same; only the speed differs (about 3x on an idle CPU, less
on a loaded one, where waiting for a core pads both).
"""
import argparse

import torch

import trainguard
from trainguard.demo.tinylm import TinyLM, batch, corpus

parser = argparse.ArgumentParser()
parser.add_argument("--variant", choices=["baseline", "fast"], required=True)
parser.add_argument("--steps", type=int, default=60)
args = parser.parse_args()

torch.manual_seed(0)
torch.set_num_threads(1)
gen = torch.Generator().manual_seed(0)
data = corpus()
model = TinyLM(dim=64, layers=2)
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
guard = trainguard.watch(model, opt, total_steps=args.steps, config={"batch_size": 8, "variant": args.variant})
with guard.phase("train"):
    for step in range(1, args.steps + 1):
        x, y = batch(data, 8, model.ctx, gen)
        loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        if args.variant == "baseline":
            with torch.no_grad():  # the redundant "clean loss" forwards the fast variant drops
                for _ in range(3):
                    model(x)
        loss.backward()
        opt.step()
        opt.zero_grad()
        guard.step(loss)
        if guard.due("eval", every=20):
            with guard.phase("eval"), torch.no_grad():
                xv, yv = batch(data, 8, model.ctx, torch.Generator().manual_seed(step))
                val = torch.nn.functional.cross_entropy(model(xv).flatten(0, 1), yv.flatten())
            guard.eval(loss=val)
guard.finish()
