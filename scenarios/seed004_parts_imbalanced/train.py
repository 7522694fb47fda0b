"""Seed 004's loss: an unnormalised feature MSE (sum over hidden units), a KD loss and a tiny balance term."""
import torch

import trainguard
from trainguard.demo.toys import MLP, clusters, minibatch

torch.manual_seed(0); torch.set_num_threads(1)
x, y = clusters()
gen = torch.Generator().manual_seed(0)
teacher, student = MLP(hidden=128), MLP()
proj = torch.nn.Linear(64, 128)
opt = torch.optim.AdamW(list(student.parameters()) + list(proj.parameters()), lr=1e-3)
steps = 200
guard = trainguard.watch(student, opt, total_steps=steps)
for step in range(1, steps + 1):
    xb, _ = minibatch(x, y, 64, gen)
    with torch.no_grad():
        t_feat = teacher.body(xb) * 12
        t_logits = teacher.head(t_feat / 12)
    s_feat = student.body(xb)
    feature = ((proj(s_feat) - t_feat) ** 2).sum(1).mean()  # summed over 128 units: 150-200
    kd = torch.nn.functional.kl_div(torch.log_softmax(student.head(s_feat) / 0.1, -1),
                                    torch.softmax(t_logits / 0.1, -1), reduction="batchmean")
    balance = 1e-4 * torch.ones(())  # a load-balance term that never mattered
    loss = feature + kd + balance
    loss.backward(); opt.step(); opt.zero_grad()
    guard.step(loss, parts={"feature": feature, "kd": kd, "balance": balance})
guard.finish()
