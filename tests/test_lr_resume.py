"""TG105 lr-restarts-at-resume (issue 31, item 4): after a resume the LR continues where the plan had it."""

from __future__ import annotations

import pytest

from trainguard.rules.schedule import LrRestartsAtResume

pytestmark = pytest.mark.unit


def _plan(step: int) -> float:
    return 1e-3 * min(1.0, step / 100)  # warm-up over 100 steps, then flat


def _run(resumed_lr, *, event: dict | None) -> list:
    rule = LrRestartsAtResume({"total_steps": 300})
    found = []
    for step in range(1, 131):
        found.append(rule.on_step({"step": step, "lr": _plan(step), "attempt": 0}))
    if event is not None:
        rule.on_event(event)
    for step in range(101, 161):
        found.append(rule.on_step({"step": step, "lr": resumed_lr(step), "attempt": 1}))
    return [f for f in found if f is not None]


NEW_ATTEMPT = {"kind": "probe", "name": "start", "step": None, "data": {"attempt": 1}}


def test_a_schedule_back_in_its_warm_up_after_a_restart_is_found_at_once() -> None:
    found = _run(lambda s: 1e-3 * (s - 100) / 100, event=NEW_ATTEMPT)
    assert len(found) == 1 and found[0].evidence["detected_step"] == 103
    assert "(attempt 1)" in found[0].summary and "100x lower" in found[0].summary


def test_a_chained_warm_up_multiplying_a_restored_lr_is_found_when_it_passes_5x() -> None:
    found = _run(lambda s: 1e-3 * (1 + (s - 101)), event={"kind": "probe", "name": "set_step", "step": 100,
                                                           "data": {"step": 100}})
    assert len(found) == 1 and found[0].step == 105 and "higher" in found[0].summary


def test_steps_starting_again_are_a_resume_even_without_an_event() -> None:
    assert len(_run(lambda s: 1e-5, event=None)) == 1


def test_a_schedule_that_continues_is_quiet() -> None:
    assert _run(_plan, event=NEW_ATTEMPT) == []
