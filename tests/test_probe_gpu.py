"""The probe on a GPU: its rows against the loop's own numbers, with no host-device sync, on the default
stream and on a stream of the loop's own (the step's values are stacked on the training thread's stream
and copied to the host later, by the background thread, on that same stream).

Run: pytest tests/test_probe_gpu.py   (skipped without CUDA; also `python tests/test_probe_gpu.py`)
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
from pathlib import Path

import torch

import trainguard
from trainguard.store.reader import RunReader

try:
    import pytest

    needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
except ImportError:  # run as a script on a host without pytest
    def needs_cuda(fn):
        return fn


def _near(got: float, want: float, rel: float) -> bool:
    return abs(got - want) <= rel * max(abs(want), 1e-12)


def _gpu_loop(run_dir: Path, *, stream: torch.cuda.Stream | None = None, steps: int = 30, grad_accum: int = 2):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    guard = trainguard.watch(model, opt, total_steps=steps, grad_accum=grad_accum, run_dir=run_dir, stats_every=1)
    weight = torch.tensor(0.25, device="cuda")
    kept = []  # (micro losses, grad norm) of each step as device tensors, read after the loop
    with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
        torch.cuda.set_sync_debug_mode("error")  # a sync from here on raises (the guard's would be logged)
        try:
            for _ in range(steps):
                losses = []
                for _ in range(grad_accum):
                    x = torch.randn(16, 32, device="cuda")
                    with torch.autocast("cuda", dtype=torch.bfloat16):
                        out = model(x)
                    loss = out.float().pow(2).mean()
                    (loss / grad_accum).backward()
                    guard.step(loss, parts={"a": loss * 0.5, "b": 0.5}, weights={"a": weight, "b": 2.0})
                    losses.append(loss.detach().clone())
                norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()]))
                kept.append((losses, norm))
                opt.step()
                opt.zero_grad(set_to_none=True)
        finally:
            torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    guard.finish()
    reference = [(sum(x.item() for x in losses) / grad_accum, norm.item()) for losses, norm in kept]
    return guard, reference


def _check(guard, reference) -> None:
    with RunReader(guard.run_dir) as reader:
        rows = list(reader.steps())
    assert [r["step"] for r in rows] == list(range(1, len(reference) + 1))
    for row, (loss, norm) in zip(rows, reference):
        assert _near(row["loss"], loss, 1e-5), (row, loss)
        assert _near(row["parts"]["a"], loss * 0.5, 1e-5) and row["parts"]["b"] == 0.5, row
        assert row["weights"] == {"a": 0.25, "b": 2.0}, row
        assert _near(row["grad_norm"], norm, 1e-3), (row, norm)
        assert row["update_ratio"] > 0 and row["nonfinite"] == 0
    log = Path(guard.run_dir) / "guard.log"
    assert not log.exists() or "error" not in log.read_text()


@needs_cuda
def test_gpu_rows_match_the_loop_without_a_sync(tmp_path: Path) -> None:
    _check(*_gpu_loop(tmp_path / "run"))


@needs_cuda
def test_gpu_rows_match_on_a_stream_of_the_loops_own(tmp_path: Path) -> None:
    _check(*_gpu_loop(tmp_path / "run", stream=torch.cuda.Stream()))


def _scaler_loop(run_dir: Path, steps: int = 20):
    """fp16 with a GradScaler (whose own `step` reads found_inf: a sync of the loop's, not the guard's)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(32, 1).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    scaler = torch.amp.GradScaler("cuda")
    guard = trainguard.watch(model, opt, total_steps=steps, run_dir=run_dir, scaler=scaler, stats_every=1)
    kept = []
    for _ in range(steps):
        with torch.autocast("cuda", dtype=torch.float16):
            loss = model(torch.randn(16, 32, device="cuda")).float().pow(2).mean()
        scaler.scale(loss).backward()
        guard.step(loss)
        kept.append((loss.detach().clone(), scaler._scale.clone()))
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
    guard.finish()
    with RunReader(guard.run_dir) as reader:
        rows = list(reader.steps())
    assert len(rows) == steps
    for row, (loss, scale) in zip(rows, kept):
        assert _near(row["loss"], loss.item(), 1e-5), (row, loss)
        assert row["loss_scale"] == scale.item(), (row, scale)


@needs_cuda
def test_gpu_rows_carry_the_grad_scalers_scale(tmp_path: Path) -> None:
    _scaler_loop(tmp_path / "run")


if __name__ == "__main__":  # where pytest is not installed (a bare GPU host)
    if not torch.cuda.is_available():
        sys.exit("needs a CUDA GPU")
    for name, stream in (("default stream", None), ("own stream", torch.cuda.Stream())):
        with tempfile.TemporaryDirectory() as d:
            _check(*_gpu_loop(Path(d) / "run", stream=stream))
        print(f"ok: {name}")
    with tempfile.TemporaryDirectory() as d:
        _scaler_loop(Path(d) / "run")
    print("ok: GradScaler")
