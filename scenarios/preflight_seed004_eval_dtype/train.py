"""Seed 004: a bf16 teacher feeds an fp32 projector. Training runs under autocast, which hides the
mismatch; the evaluation (every 2500 of 25000 steps) runs without autocast and crashes on the dtypes."""
import torch

import trainguard

torch.manual_seed(0)
torch.set_num_threads(1)
teacher = torch.nn.Linear(16, 16).to(torch.bfloat16).requires_grad_(False)
projector = torch.nn.Linear(16, 16)  # float32
student = torch.nn.Linear(16, 16)
params = list(projector.parameters()) + list(student.parameters())
opt = torch.optim.AdamW(params, lr=1e-3)
guard = trainguard.watch(student, opt, total_steps=25_000)


def kd_loss(x: torch.Tensor) -> torch.Tensor:
    target = projector(teacher(x.to(torch.bfloat16)))
    return (student(x) - target.float()).pow(2).mean()


with guard.phase("train"):
    for step in range(1, 25_001):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = kd_loss(torch.randn(8, 16))
        loss.backward(); opt.step(); opt.zero_grad()
        guard.step(loss)
        if guard.due("eval", every=2500):
            with guard.phase("eval"), torch.no_grad():  # no autocast here
                val = kd_loss(torch.randn(8, 16))
            guard.eval(loss=val)
guard.finish()
