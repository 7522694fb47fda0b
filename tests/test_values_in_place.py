"""A value given to `guard.step` and changed in place after its step closed is never recorded wrong.

The probe reads a step's values off the training thread, after the step (probe/steps.py: a CPU number
where it is, a GPU step's values stacked by the background thread). A loop that reuses one tensor, an
accumulator zeroed and refilled every step, changes a value after giving it: read later, it would say
the next step's number. Such a step is recorded without its loss instead, said once in guard.log, and the
values of later steps are read as each step closes. (Its GPU twin is below, skipped without CUDA.) A
change made before the step closes (between `guard.step` and `optimizer.step`) is read as the step's,
as it always was. Values that cannot wait are read at once: a tensor made under inference mode (it has no
version counter) and a whole vector (a per-sample loss, reduced at once rather than held).
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest
import torch

import trainguard
from trainguard.store.reader import RunReader

LINE = "changed in place"


def linear_run(run_dir: Path, steps: int, device: str = "cpu"):
    """A one-layer model, its optimizer and a guard watching them."""
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    return model, opt, trainguard.watch(model, opt, total_steps=steps, run_dir=run_dir)


def accumulator_loop(run_dir: Path, device: str = "cpu", steps: int = 30, settle_after: int = 5):
    """One accumulator tensor, zeroed and refilled in place at every step and given to guard.step; returns
    the guard and the number each step gave. After `settle_after` steps it waits (at most 20 s) until the
    background thread has read them and seen the change."""
    model, opt, guard = linear_run(run_dir, steps, device)
    acc = torch.zeros((), device=device)
    given = []
    # The background thread is kept from reading the first steps until the loop has zeroed and refilled
    # the accumulator past them: otherwise, on a loaded machine, it may read each step before the next
    # zero_() and see no change at all (the change must come before the read, not race it).
    guard._drain_lock.acquire()
    for i in range(steps):
        loss = model(torch.randn(16, 8, device=device)).pow(2).mean()
        loss.backward()
        acc.zero_()
        acc += loss.detach()
        guard.step(acc)
        given.append(acc.item())
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i + 1 == settle_after:
            guard._drain_lock.release()
            log = Path(guard.run_dir) / "guard.log"
            deadline = time.time() + 20
            while time.time() < deadline and not (log.exists() and LINE in log.read_text()):
                time.sleep(0.05)
    guard.finish()
    return guard, given


def check(guard, given, settle_after: int = 5) -> None:
    with RunReader(guard.run_dir) as reader:
        rows = list(reader.steps())
    assert [r["step"] for r in rows] == list(range(1, len(given) + 1))
    for row, value in zip(rows, given):
        # never the wrong number: the step's own, or none
        assert row["loss"] is None or math.isclose(row["loss"], value, rel_tol=1e-6), (row, value)
    # the steps read after the change was seen are all read as they closed, with their own numbers
    assert all(r["loss"] is not None for r in rows[settle_after + 1:]), rows
    assert any(r["loss"] is None for r in rows[:settle_after]), "the change was never seen"
    text = (Path(guard.run_dir) / "guard.log").read_text()
    assert text.count(LINE) == 1, text


def test_an_accumulator_reused_in_place_is_never_recorded_wrong(tmp_path: Path) -> None:
    check(*accumulator_loop(tmp_path / "run"))


def test_values_left_alone_are_read_after_the_step_as_before(tmp_path: Path) -> None:
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
    log = Path(guard.run_dir) / "guard.log"
    assert not log.exists() or LINE not in log.read_text()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_an_accumulator_reused_in_place_on_a_gpu_is_never_recorded_wrong(tmp_path: Path) -> None:
    # the background thread stacks a GPU step's values on the training thread's stream; the version
    # counters are read after that launch, so a change launched before it is seen
    check(*accumulator_loop(tmp_path / "run", device="cuda"))


def test_values_without_a_version_counter_or_whole_vectors_are_read_at_once(tmp_path: Path) -> None:
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
