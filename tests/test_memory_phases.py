"""TG524 memory-creep per phase and on short runs (issue 31, item 3).

Events are fed as the probe stores them: memory samples with the phase they were taken in, the phase edges
of `guard.phase("eval")`, `guard.eval(...)` results.
"""

from __future__ import annotations

import pytest

from trainguard.rules.memory import MemoryCreep

pytestmark = pytest.mark.unit
MIB = 2**20


def _sample(step: int, rss: float, phase: str | None = None) -> dict:
    return {"kind": "sample", "name": "memory", "step": step, "data": {"rss": rss, "phase": phase}}


def _phase(step: int, edge: str) -> dict:
    return {"kind": "phase", "name": "eval", "step": step, "data": {"edge": edge}}


def _run(evals: int, left_per_eval: float, *, marked: bool = True, total: int = 2400) -> list:
    rule = MemoryCreep({"total_steps": total})
    rss, found = 400 * MIB, []
    for step in range(1, 20 * evals + 2):
        found.append(rule.on_event(_sample(step, rss)))
        if step % 20 == 0:
            if marked:
                rule.on_event(_phase(step, "begin"))
                found.append(rule.on_event(_sample(step, rss + 80 * MIB, "eval")))
                rule.on_event(_phase(step, "end"))
            else:
                rule.on_event({"kind": "eval", "step": step, "data": {"accuracy": 0.5}})
            rss += left_per_eval
    return [f for f in found if f is not None]


def test_a_leak_that_grows_only_at_evaluations_is_found_at_the_fourth_evaluation() -> None:
    found = _run(24, 50 * MIB)
    assert len(found) == 1 and found[0].cause == "rss-eval"
    assert found[0].evidence["detected_step"] == 81 and "by 50, 50, 50 MiB" in found[0].summary


def test_evaluations_without_a_phase_are_judged_from_their_results() -> None:
    found = _run(24, 50 * MIB, marked=False)
    assert len(found) == 1 and found[0].cause == "rss-eval"


def test_an_evaluation_whose_memory_comes_back_is_no_leak() -> None:
    assert _run(24, 0.0) == [] and _run(24, 1 * MIB) == []


def test_a_short_run_is_judged_at_its_end_by_its_growth_a_step() -> None:
    rule = MemoryCreep({"total_steps": 120})
    for step in range(1, 121):
        assert rule.on_event(_sample(step, 300 * MIB + step * 2 * MIB)) is None
    f = rule.end()
    assert f is not None and f.cause == "rss-short-run" and "in a run of 120 steps" in f.summary


def test_a_short_run_whose_memory_levels_off_after_its_warm_up_is_quiet() -> None:
    rule = MemoryCreep({"total_steps": 120})
    for step in range(1, 121):
        rule.on_event(_sample(step, 300 * MIB + min(step, 30) * 8 * MIB))
    assert rule.end() is None
