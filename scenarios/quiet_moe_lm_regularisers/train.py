"""Healthy: a small MoE language model trained the standard way, its regularisers small by design. Must stay quiet.

A top-2 router over 4 experts with the three usual terms beside the LM loss, each reported raw with its
conventional coefficient as its weight (trainguard.demo.moelm): the router's load-balancing loss at 0.01,
the router z-loss at 1e-3 and PaLM's z-loss at 1e-4. Weighted, each sits 100-10,000x below the LM loss on
purpose: loss-parts-imbalanced leaves a note (info), never a warning.
"""
import torch

import trainguard
from trainguard.demo.moelm import WEIGHTS, MoELM, loss_parts
from trainguard.demo.tinylm import batch, corpus

torch.manual_seed(0); torch.set_num_threads(1)
gen = torch.Generator().manual_seed(0)
data = corpus()
model = MoELM()
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
steps = 300
guard = trainguard.watch(model, opt, total_steps=steps)
for step in range(1, steps + 1):
    x, y = batch(data, 8, model.ctx, gen)
    parts = loss_parts(model, model(x), y)
    loss = sum(WEIGHTS[k] * v for k, v in parts.items())
    loss.backward(); opt.step(); opt.zero_grad()
    guard.experts(model.moe.load, layer=0)
    guard.step(loss, parts=parts, weights=WEIGHTS)
guard.finish()
