"""Healthy: host memory that grows by hundreds of MiB while the run warms up, then levels off. Must stay quiet.

What a GPU process does in its first steps, on the CPU: CUDA loads each kernel's module on its first launch
(lazy loading), so RSS climbs by hundreds of MiB over the first ~100 steps as new kernels run (an H200
distillation run grew 214-300 MiB over steps 10-100), and again at the first evaluation, whose shapes
launch kernels training never did. Here `launch` keeps each kernel's "module" (a few MiB of host memory)
the first time it is used: many new ones in the first 30 steps, fewer up to step 80, a trickle to step
140, 64 MiB more at the first evaluation, none after. Runs 400 of its planned 2,000 steps (20 ms of sleep
stands for a slower real step)."""
import time

import torch

import trainguard
from trainguard.demo.toys import MLP, clusters, minibatch

MIB = 2**20
modules = {}  # kernel name -> its loaded module: bounded by the kernels the program has


def launch(kernel: str, size_mib: int) -> None:
    if kernel not in modules:
        modules[kernel] = torch.ones(size_mib * MIB // 4)  # loaded on first launch, kept for the run


def kernels_first_used_at(step: int) -> list[tuple[str, int]]:
    """The kernels a step launches for the first time: bursts early, a trickle later, none after 140."""
    if step <= 30:
        return [(f"fwd{step}", 4), (f"bwd{step}", 2)]
    if step <= 80:
        return [(f"fused{step}", 3)]
    if step <= 140 and step % 4 == 0:
        return [(f"tail{step}", 1)]
    return []


torch.manual_seed(0); torch.set_num_threads(1)
x, y = clusters()
gen = torch.Generator().manual_seed(0)
model = MLP()
opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
steps = 2000
guard = trainguard.watch(model, opt, total_steps=steps)
for step in range(1, steps + 1):
    for kernel, size in kernels_first_used_at(step):
        launch(kernel, size)
    xb, yb = minibatch(x, y, 64, gen)
    loss = torch.nn.functional.cross_entropy(model(xb), yb)
    loss.backward(); opt.step(); opt.zero_grad()
    guard.step(loss)
    time.sleep(0.02)
    if step % 150 == 0:
        with guard.phase("eval"), torch.no_grad():
            for i in range(8):  # the eval's own shapes: new kernels the first time only
                launch(f"eval{i}", 8)
                model(x[:512])
    if step == 400:
        break
guard.finish()
