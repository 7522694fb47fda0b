"""A value given to `guard.step` is never recorded wrong, and the guard never holds the loop's graphs.

On the CPU the probe reads a step's values as the step is emitted at its optimizer step (probe/steps.py
`_emit`), so a loop that reuses one tensor, an accumulator zeroed and refilled in place every step, has each
step recorded with its own number however late the background thread runs (it is held off here on
purpose). On a GPU the background thread stacks a step's values later, on the training thread's stream,
after comparing their version counters with those read at the step: an accumulator changed in place since
is seen changed, that step is recorded without its loss (never with the next step's number), said once in
guard.log, and later steps are stacked as they close (the GPU twin below, skipped without CUDA). The loop's
tensors (and their autograd graphs) are never kept: the guard holds detached values. Values that are no
plain scalars are read as well: a tensor made under inference mode and a whole vector (its mean).
"""

from __future__ import annotations

import gc
import math
import time
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
    with guard.probe.drainer.lock:  # the background thread drains nothing until the loop is over
        given = [accumulator_step(model, opt, guard, acc) for _ in range(steps)]
    guard.finish()
    return guard, given


def accumulator_step(model, opt, guard, acc: torch.Tensor) -> float:
    """One step that gives `acc`, zeroed and refilled in place with the loss, to guard.step; returns its value."""
    loss = model(torch.randn(16, 8, device=acc.device)).pow(2).mean()
    loss.backward()
    acc.zero_()
    acc += loss.detach()
    guard.step(acc)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return acc.item()


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
def test_an_accumulator_reused_in_place_on_a_gpu_is_never_recorded_wrong(tmp_path: Path) -> None:
    model, opt, guard = linear_run(tmp_path / "run", 30, device="cuda")
    acc = torch.zeros((), device="cuda")
    given = []
    settle = 5
    guard.probe.drainer.lock.acquire()  # the first steps wait for the background thread until the loop changed them
    for i in range(30):
        given.append(accumulator_step(model, opt, guard, acc))
        if i + 1 == settle:
            guard.probe.drainer.lock.release()
            log = Path(guard.run_dir) / "guard.log"
            deadline = time.time() + 20
            while time.time() < deadline and not (log.exists() and "changed in place" in log.read_text()):
                time.sleep(0.05)
    guard.finish()
    with RunReader(guard.run_dir) as reader:
        rows = list(reader.steps())
    assert [r["step"] for r in rows] == list(range(1, 31))
    for row, value in zip(rows, given):  # never the wrong number: the step's own, or none
        assert row["loss"] is None or math.isclose(row["loss"], value, rel_tol=1e-6), (row, value)
    assert any(r["loss"] is None for r in rows[:settle]), "the change was never seen"
    assert all(r["loss"] is not None for r in rows[settle + 1:]), rows  # stacked as they closed, from then on
    assert (Path(guard.run_dir) / "guard.log").read_text().count("changed in place") == 1


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
