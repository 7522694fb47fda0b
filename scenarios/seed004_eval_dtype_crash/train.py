"""Seed 004: a bf16 teacher and an fp32 projector meet outside autocast in the evaluation path.

Training runs under autocast, which casts both sides of every matmul to bf16, so it trains for 60 steps
without a word. The first evaluation runs without autocast and crashes: bf16 features against fp32
weights ("mat1 and mat2 must have the same dtype"), the same error seed 004 met on the GPU.
"""
import torch

import trainguard

teacher = torch.nn.Linear(16, 32).to(torch.bfloat16).requires_grad_(False)
student = torch.nn.Linear(16, 32)
projector = torch.nn.Linear(32, 32)
params = list(student.parameters()) + list(projector.parameters())
opt = torch.optim.AdamW(params, lr=1e-3)
guard = trainguard.watch(student, opt, total_steps=100)


def distill_loss(x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        t = teacher(x.to(torch.bfloat16))
    return (projector(t) - student(x)).pow(2).mean()  # bf16 teacher features into the fp32 projector


with guard.phase("train"):
    for step in range(1, 101):
        x = torch.randn(8, 16)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = distill_loss(x)
        loss.backward(); opt.step(); opt.zero_grad()
        guard.step(loss)
        if guard.due("eval", every=60):
            with guard.phase("eval"), torch.no_grad():
                val = distill_loss(torch.randn(8, 16))  # the planted crash: evaluation without autocast
                guard.eval(loss=val)
guard.finish()
