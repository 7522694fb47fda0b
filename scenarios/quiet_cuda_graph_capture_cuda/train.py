"""A training step captured as a CUDA graph, in torch's default capture mode, under the guard (healthy).

PyTorch's whole-network capture recipe (the "CUDA Graphs" section of the CUDA semantics notes): warm up
on a side stream, capture forward, backward and `optimizer.step()` with `torch.cuda.graph(g)`, then
refill the static inputs and `g.replay()`. The graph is captured again 50 times (a new batch shape, a
new learning-rate phase and a rebuilt graph all do that), each capture replayed 10 times with a
`guard.step` after each replay: the guard's background thread always has device copies in flight and
memory samples to take when a capture begins.

In the default `capture_error_mode="global"`, a CUDA call unsafe during a capture (cudaEventQuery,
cudaMemGetInfo, a pinned allocation) from ANY thread invalidates the capture
(cudaErrorStreamCaptureInvalidated): the guard's own background thread used to be able to make this run
fail. The probe's capture gate (probe/capturegate.py) keeps it, and the probe's hooks, off the device
while a capture is open. Expected: the run completes, no finding, and each replay's loss equals the loss
of an eager twin (a copy of the model trained step by step on the same batches, without a graph).

There is no separate healthy twin: this is the healthy case, and the failure it guards against would be
a crash caused by the guard. Needs CUDA.

On an H200 (torch 2.11+cu130), 2026-11-26: with the gate, completed and quiet under `trainguard run`
(zoo, 11.3 s). The same run with the gate switched off (TRAINGUARD_CAPTURE_GATE=0) was not obtained in
that device call (its command was wrong), so the failure without the gate is shown here only by the
CPU test's control (tests/test_capturegate.py) and by the distillation recipe's original report.
"""
import copy

import torch
from torch import nn

import trainguard

torch.manual_seed(0)
device = "cuda"
width, depth, batch = 256, 3, 128
layers = []
for _ in range(depth):
    layers += [nn.Linear(width, width), nn.ReLU()]
model = nn.Sequential(*layers, nn.Linear(width, 1)).to(device)
twin = copy.deepcopy(model)  # made before watch(): the eager reference, without the guard's hooks
opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
twin_opt = torch.optim.SGD(twin.parameters(), lr=0.02, momentum=0.9)
captures, replays, warmup = 50, 10, 3
guard = trainguard.watch(model, opt, total_steps=warmup + captures * replays)
teacher = torch.randn(width, 1, device=device) / width ** 0.5


def batch_of(step):
    g = torch.Generator(device=device).manual_seed(step)
    x = torch.randn(batch, width, device=device, generator=g)
    return x, x @ teacher


def eager_step(net, optimizer, x, y):
    optimizer.zero_grad(set_to_none=True)
    loss = nn.functional.mse_loss(net(x), y)
    loss.backward()
    optimizer.step()
    return loss


static_x, static_y = batch_of(0)
side = torch.cuda.Stream()
side.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(side):  # warm-up steps on a side stream, as the recipe says
    for step in range(1, warmup + 1):
        x, y = batch_of(step)
        static_x.copy_(x), static_y.copy_(y)
        loss = eager_step(model, opt, static_x, static_y)
        eager_step(twin, twin_opt, x, y)
        guard.step(loss)
torch.cuda.current_stream().wait_stream(side)

worst = torch.zeros((), device=device)
step = warmup
for capture in range(captures):
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):  # capture_error_mode="global", torch's default
        static_loss = nn.functional.mse_loss(model(static_x), static_y)
        static_loss.backward()
        opt.step()
    for _ in range(replays):
        step += 1
        x, y = batch_of(step)
        static_x.copy_(x), static_y.copy_(y)
        graph.replay()
        expected = eager_step(twin, twin_opt, x, y).detach()
        worst = torch.maximum(worst, (static_loss - expected).abs() / expected.abs().clamp_min(1e-12))
        guard.step(static_loss)
worst = float(worst)
print(f"{captures} captures, {step} steps; replayed losses within {worst:.2e} of the eager twin's")
assert worst < 1e-3, f"a replayed loss differs from the eager twin's by {worst:.2e}"
guard.finish()
