"""A value given to `guard.step` is recorded as it was at its step, and not held past the step.

The probe keeps references to what the loop gives and reads them (CPU) or stacks them on the device (GPU)
once, as the step is emitted at its optimizer step (probe/steps.py `_emit`); the background thread only
copies finished vectors. So a loop that reuses one tensor, an accumulator zeroed and refilled in place every
step, has each step recorded with its own number, however late the background thread runs (it is held off
here on purpose); and the loop's tensors (and their autograd graphs) are let go at the step, never kept
for the background thread. (The GPU twin is below, skipped without CUDA.) Values that are no plain
scalars are read as well: a tensor made under inference mode and a whole vector (a per-sample loss, its mean).
"""

from __future__ import annotations

import gc
import math
import weakref
from pathlib import Path

import pytest
import torch

import trainguard
from trainguard.store.reader import RunReader


def linear_run(run_dir: Path, steps: int, device: str = "cpu", grad_accum: int = 1):
    """A one-layer model, its optimizer and a guard watching them."""
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    return model, opt, trainguard.watch(model, opt, total_steps=steps, run_dir=run_dir, grad_accum=grad_accum)


def accumulator_loop(run_dir: Path, device: str = "cpu", steps: int = 30):
    """One accumulator tensor, zeroed and refilled in place at every step and given to guard.step, while the
    background thread is held off (it would read each value after the next step changed it); returns the
    guard and the number each step gave."""
    model, opt, guard = linear_run(run_dir, steps, device)
    acc = torch.zeros((), device=device)
    given = []
    with guard._drain_lock:  # the background thread drains nothing until the loop is over
        for _ in range(steps):
            loss = model(torch.randn(16, 8, device=device)).pow(2).mean()
            loss.backward()
            acc.zero_()
            acc += loss.detach()
            guard.step(acc)
            given.append(acc.item())
            opt.step()
            opt.zero_grad(set_to_none=True)
    guard.finish()
    return guard, given


def check(guard, given) -> None:
    with RunReader(guard.run_dir) as reader:
        rows = list(reader.steps())
    assert [r["step"] for r in rows] == list(range(1, len(given) + 1))
    for row, value in zip(rows, given):
        assert row["loss"] is not None and math.isclose(row["loss"], value, rel_tol=1e-6), (row, value)
    log = Path(guard.run_dir) / "guard.log"
    assert not log.exists() or "rror" not in log.read_text(), log.read_text()


def test_an_accumulator_reused_in_place_is_recorded_with_each_steps_own_number(tmp_path: Path) -> None:
    check(*accumulator_loop(tmp_path / "run"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_an_accumulator_reused_in_place_on_a_gpu_is_recorded_with_each_steps_own_number(tmp_path: Path) -> None:
    # stacked on the training thread's stream at the optimizer step, before the next zero_() is launched
    check(*accumulator_loop(tmp_path / "run", device="cuda"))


def test_the_loops_tensors_are_let_go_at_their_optimizer_step(tmp_path: Path) -> None:
    # the loss and its parts (with their autograd graphs) are never held by the guard (it keeps detached
    # values): once the optimizer stepped and the loop dropped its own references, nothing of them is alive
    model, opt, guard = linear_run(tmp_path / "run", 10, grad_accum=4)
    for _ in range(10):
        window = []
        for _ in range(4):
            loss = model(torch.randn(16, 8)).pow(2).mean()
            part = loss * 0.5
            (loss / 4).backward()
            guard.step(loss, parts={"half": part})
            window += [weakref.ref(loss), weakref.ref(part)]  # (a tensor holds its graph)
        opt.step()
        opt.zero_grad(set_to_none=True)
        del loss, part
        gc.collect()
        assert all(r() is None for r in window), "a tensor given to guard.step outlived its step"
    guard.finish()
    with RunReader(guard.run_dir) as reader:
        rows = list(reader.steps())
    assert len(rows) == 10 and all(r["loss"] is not None and r["parts"]["half"] is not None for r in rows)


def test_values_left_alone_are_read_as_before(tmp_path: Path) -> None:
    model, opt, guard = linear_run(tmp_path / "run", 20)
    given = []
    for _ in range(20):
        loss = model(torch.randn(16, 8)).pow(2).mean()
        loss.backward()
        guard.step(loss, parts={"half": loss.detach() / 2})
        given.append(loss.item())
        opt.step()
        opt.zero_grad(set_to_none=True)
    guard.finish()
    with RunReader(guard.run_dir) as reader:
        rows = list(reader.steps())
    assert [round(r["loss"], 6) for r in rows] == [round(v, 6) for v in given]
    assert all(math.isclose(r["parts"]["half"], r["loss"] / 2, rel_tol=1e-6) for r in rows)


def test_inference_mode_values_and_whole_vectors_are_read(tmp_path: Path) -> None:
    model, opt, guard = linear_run(tmp_path / "run", 30)
    given = []
    for _ in range(30):
        x = torch.randn(16, 8)
        per_sample = model(x).pow(2).squeeze(1)  # a vector: reduced when its step closes
        loss = per_sample.mean()
        loss.backward()
        with torch.inference_mode():
            val = model(x).pow(2).mean()  # no version counter
        guard.step(per_sample)
        guard.log(val_loss=val)
        given.append((loss.item(), val.item()))
        opt.step()
        opt.zero_grad(set_to_none=True)
    guard.finish()
    with RunReader(guard.run_dir) as reader:
        rows = list(reader.steps())
    assert len(rows) == 30, rows
    for row, (loss, _) in zip(rows, given):
        assert math.isclose(row["loss"], loss, rel_tol=1e-5), (row, loss)
    # logged after a step's guard.step, a value goes with the next step
    for row, (_, val) in zip(rows[1:], given):
        assert math.isclose(row["extra"]["val_loss"], val, rel_tol=1e-5), (row, val)
    log = Path(guard.run_dir) / "guard.log"
    assert not log.exists() or "rror" not in log.read_text(), log.read_text()
