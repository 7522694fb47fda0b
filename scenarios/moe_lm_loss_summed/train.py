"""The healthy MoE LM of quiet_moe_lm_regularisers with one bug: its LM loss is summed over the 256 tokens of a
batch instead of averaged. The regularisers keep their conventional weights; the LM loss is ~1,000x what
those weights were set against."""
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
    parts = loss_parts(model, model(x), y, reduction="sum")  # the bug: "sum" where "mean" was meant
    loss = sum(WEIGHTS[k] * v for k, v in parts.items())
    loss.backward(); opt.step(); opt.zero_grad()
    guard.experts(model.moe.load, layer=0)
    guard.step(loss, parts=parts, weights=WEIGHTS)
guard.finish()
