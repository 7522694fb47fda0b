"""Healthy twin of log_flood: a reinforcement-learning-style loop whose steps are slow and each prints a
report of a dozen lines (timings, gradient magnitudes, a sampled answer). More than 8 lines a step, as
the flood, but a terminal scrolling 15 lines a second is read; modelled on real RL logs that print
~30 lines a step at minutes a step.
"""
import time

import torch

import trainguard
from trainguard.demo.toys import MLP, clusters, minibatch

torch.manual_seed(0); torch.set_num_threads(1)
x, y = clusters()
gen = torch.Generator().manual_seed(0)
model = MLP()
opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
steps = 30
guard = trainguard.watch(model, opt, total_steps=steps)
for step in range(1, steps + 1):
    t0 = time.time()
    xb, yb = minibatch(x, y, 64, gen)
    loss = torch.nn.functional.cross_entropy(model(xb), yb)
    loss.backward()
    grad = sum(p.grad.abs().mean().item() for p in model.parameters()) / len(list(model.parameters()))
    opt.step(); opt.zero_grad()
    guard.step(loss)
    time.sleep(0.8)  # sampling and scoring, the slow part of such a loop
    print(f"=== step {step}/{steps} ===")
    print(f"Step: {step} | Loss: {loss.item():.4f}")
    print("--- Gradient Check ---")
    print(f"Average gradient magnitude: {grad:.6f}")
    print("=== PROFILER ===")
    print(f"Sampling:   {0.8:.2f}s")
    print(f"Backward:   {time.time() - t0 - 0.8:.2f}s")
    print(f"Prediction: class {int(model(xb[:1]).argmax())} for a sample of class {int(yb[0])}")
    for line in ("Reasoning:", "* the sample sits near its cluster's centre", "* so the class is clear", "==="):
        print(line)
guard.finish()
