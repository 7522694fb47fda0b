"""The step assembler (probe/steps.py) driven alone: no drain, no thread, no optimizer hooks installed.

What it hands over: one record per optimizer step, once both halves are in (or the other half is clearly
not coming), with the micro-batches' values read on the CPU; counting that goes on when switched off; a
forked child that counts nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from trainguard.probe.handoff import Handoff
from trainguard.probe.state import ProbeState
from trainguard.probe.steps import StepRecorder
from trainguard.store.selflog import GuardLog
from trainguard.store.writer import StoreWriter

pytestmark = pytest.mark.unit


def _assembler(run_dir: Path, grad_accum: int = 2, optimizer: Any = None) -> tuple[StepRecorder, ProbeState, Handoff]:
    run_dir.mkdir(parents=True, exist_ok=True)
    state, handoff = ProbeState(GuardLog(run_dir, 0)), Handoff()
    steps = StepRecorder(state, handoff, StoreWriter(run_dir, rank=0, attempt=0), grad_accum=grad_accum,
                         total_steps=None, stats_every=10, optimizer=optimizer, scaler=None)
    return steps, state, handoff


def test_each_accumulation_window_is_handed_over_as_one_record_with_its_values_read(tmp_path: Path) -> None:
    steps, state, handoff = _assembler(tmp_path / "run")
    for i in range(4):
        steps.step(torch.tensor(float(i)), parts={"kd": float(i) / 2})
    steps.log(acc=0.5)  # after the last micro-batch: it goes with the next step
    assert (state.micro, state.loss_steps, state.step_count) == (4, 2, 2)
    assert [rec["step"] for rec, _ in handoff.steps] == [1, 2]
    rec, packs = handoff.steps[0]
    assert packs == [] and rec["floats"]["loss"] == [0.0, 1.0] and rec["floats"]["part:kd"] == [0.0, 0.5]
    assert rec["micro"] == 2 and rec["step_time"] is None and handoff.steps[1][0]["step_time"] is not None
    assert steps.pending == [("x:", {"acc": 0.5})]


def test_a_step_whose_optimizer_half_never_comes_is_handed_over_two_steps_later_and_said_skipped(tmp_path: Path) -> None:
    optimizer = object()  # an optimizer whose hooks tell the optimizer side (`opt_step_done`)
    steps, state, handoff = _assembler(tmp_path / "run", grad_accum=1, optimizer=optimizer)
    steps.step(1.0)
    state.opt_steps += 1
    steps.opt_step_done()
    assert [rec["step"] for rec, _ in handoff.steps] == [1]  # both halves in
    steps.step(2.0)  # step 2: its optimizer step skipped (a GradScaler's inf)
    steps.step(3.0)
    assert [rec["step"] for rec, _ in handoff.steps] == [1]  # waits for the other half...
    steps.step(4.0)
    rec, _ = handoff.steps[-1]
    assert rec["step"] == 2 and rec["incomplete"] and rec["opt_skipped"]  # ... until two newer steps exist


def test_counting_goes_on_when_switched_off_and_a_forked_child_counts_nothing(tmp_path: Path) -> None:
    steps, state, handoff = _assembler(tmp_path / "run")
    state.disabled = True
    for _ in range(4):
        steps.step(1.0)
    assert state.micro == 4 and state.step_count == 2 and handoff.steps == []  # `due()` still counts
    steps.pid = -1  # as a forked child sees its parent's probe
    steps.step(1.0)
    assert state.micro == 4


def test_a_value_that_is_no_number_is_the_guards_error_not_the_loops(tmp_path: Path) -> None:
    steps, state, handoff = _assembler(tmp_path / "run")
    steps.step(1.0, parts={"bad": "abc"})  # float("abc") raises inside the guard: logged, counted, the loop goes on
    assert state.errors == 1 and state.micro == 1


def test_set_step_resumes_the_counters_and_drops_what_was_open(tmp_path: Path) -> None:
    steps, state, handoff = _assembler(tmp_path / "run")
    steps.step(1.0)
    steps.set_step(100)
    assert (state.micro, state.step_count, steps.pending, steps.records) == (200, 100, [], {})
    steps.step(1.0)
    steps.step(2.0)
    assert [rec["step"] for rec, _ in handoff.steps] == [101]
