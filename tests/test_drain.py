"""The drain (probe/drain.py) driven alone: records put in a hand-off by hand, no step assembler, no thread.

What it must do with them: one row per record in the real store, micro-batches averaged, the optimizer
side's values in their columns, a skipped optimizer step said, a sticky device error abandoning what is in
flight, and a heartbeat only when it says something new.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from trainguard.probe.drain import Drain
from trainguard.probe.handoff import Handoff
from trainguard.probe.phases import Phases
from trainguard.probe.replay import BatchRing
from trainguard.probe.samples import MemorySampler
from trainguard.probe.state import ProbeState
from trainguard.store.reader import RunReader
from trainguard.store.selflog import GuardLog
from trainguard.store.writer import StoreWriter

pytestmark = pytest.mark.unit


def _drain(run_dir: Path) -> tuple[Drain, ProbeState, Handoff, StoreWriter]:
    run_dir.mkdir(parents=True, exist_ok=True)
    state, handoff = ProbeState(GuardLog(run_dir, 0)), Handoff()
    writer = StoreWriter(run_dir, rank=0, attempt=0)
    phases = Phases()
    memory = MemorySampler(writer, state.selflog, phases, None)
    drain = Drain(state, handoff, writer, run_dir=run_dir, rank=0, grad_accum=2, ring=BatchRing(), memory=memory,
                  phases=phases)
    return drain, state, handoff, writer


def _steps(run_dir: Path) -> list[dict[str, Any]]:
    with RunReader(run_dir) as reader:
        return list(reader.steps())


def test_records_in_the_hand_off_become_rows_in_the_store_with_their_micro_batches_averaged(tmp_path: Path) -> None:
    drain, state, handoff, writer = _drain(tmp_path / "run")
    handoff.steps.append(({"step": 1, "t": 100.0, "micro": 2, "lr": 0.1, "data_wait": 0.25,
                           "floats": {"loss": [1.0, 3.0], "part:kd": [0.5, 1.5], "grad_norm": [4.0]}}, []))
    handoff.steps.append(({"step": 2, "t": 101.0, "micro": 4, "floats": {"loss": [5.0, 7.0]}, "incomplete": True,
                           "opt_skipped": True}, []))
    drain.drain(final=True)
    writer.flush()
    rows = _steps(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2] and handoff.steps == []
    first, second = rows
    assert first["loss"] == 2.0 and first["parts"] == {"kd": 1.0} and first["grad_norm"] == 4.0
    assert first["lr"] == 0.1 and first["data_wait"] == 0.25 and first["nonfinite"] == 0
    assert second["loss"] == 6.0 and {"incomplete", "optimizer_step_skipped"} <= set(second["extra"])
    assert drain.summary == {"step": 2, "loss": 6.0, "lr": None}


def test_a_record_whose_copies_are_not_done_waits_for_the_next_pass(tmp_path: Path) -> None:
    class Copy:
        done = False

        def ready(self) -> bool:
            return self.done

        def pairs(self) -> list[tuple[str, float]]:
            return [("loss", 9.0)]

    drain, state, handoff, writer = _drain(tmp_path / "run")
    copy = Copy()
    handoff.steps.append(({"step": 1, "t": 1.0, "micro": 2, "floats": {}}, [copy]))
    drain.drain()
    writer.flush()
    assert _steps(tmp_path / "run") == [] and len(handoff.steps) == 1  # (copies finish in order: it waits)
    copy.done = True
    drain.drain()
    writer.flush()
    assert [r["loss"] for r in _steps(tmp_path / "run")] == [9.0] and handoff.steps == []


def test_a_nonfinite_loss_is_stored_as_it_is(tmp_path: Path) -> None:
    drain, state, handoff, writer = _drain(tmp_path / "run")
    handoff.steps.append(({"step": 1, "t": 1.0, "micro": 2, "floats": {"loss": [math.nan, 1.0]}}, []))
    drain.drain(final=True)
    writer.flush()
    (row,) = _steps(tmp_path / "run")
    assert row["loss"] is not None and math.isnan(row["loss"])  # a NaN stays a NaN (never 0, never dropped)


def test_a_device_that_cannot_be_read_abandons_everything_in_flight_once(tmp_path: Path) -> None:
    class Broken:
        def ready(self) -> bool:
            raise RuntimeError("CUDA error: device-side assert triggered")

    drain, state, handoff, writer = _drain(tmp_path / "run")
    handoff.steps.append(({"step": 1, "t": 1.0, "micro": 2, "floats": {}}, [Broken()]))
    handoff.experts.append((1, None, [1.0, 2.0], None))
    drain.drain()
    assert state.device_broken and state.errors == 1
    assert handoff.steps == [] and handoff.experts == []
    handoff.steps.append(({"step": 2, "t": 2.0, "micro": 4, "floats": {"loss": [1.0]}}, []))
    drain.drain(final=True)  # nothing is read from a broken device again
    writer.flush()
    assert _steps(tmp_path / "run") == []


def test_the_heartbeat_is_queued_when_progress_moved_not_at_every_pass(tmp_path: Path) -> None:
    drain, state, handoff, writer = _drain(tmp_path / "run")
    drain.drain()
    first = drain._last_beat
    drain.drain()
    assert drain._last_beat == first  # nothing moved: the same beat, not queued again
    state.ticks += 1
    state.micro, state.loss_steps = 2, 1
    drain.drain()
    assert drain._last_beat is not None and drain._last_beat[1:3] == (2, 1) and drain._last_beat[0] is not None
