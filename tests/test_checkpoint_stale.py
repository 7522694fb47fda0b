"""TG526 checkpoint-stale: saves that stop against the run's own interval; a run that saves only on a new
best evaluation is judged by its evaluations, not its saver. Events are fed as the readers hand them to the
rules (nanoGPT's console: `step N: ... val loss X`, then `saving checkpoint to out` on a new best)."""

from __future__ import annotations

import pytest

from trainguard.rules.process import CheckpointStale

pytestmark = pytest.mark.unit


def _run(val, saves_on, steps: int = 5000, every: int = 250):
    rule = CheckpointStale({})
    found = []
    best = float("inf")
    for step in range(steps + 1):
        if step % every == 0 and step:
            v = val(step)
            rule.on_event({"kind": "eval", "step": step, "data": {"loss": v}})
            if saves_on(step, v < best):
                rule.on_event({"kind": "checkpoint", "step": step, "data": {"path": "out"}})
            best = min(best, v)
        if (f := rule.on_step({"step": step, "loss": 1.0})) is not None:
            found.append(f)
    return found


def overfits(step: int) -> float:
    return 2.0 - step / 2000 if step <= 1500 else 1.25 + (step - 1500) / 1000


def test_saves_on_each_new_best_that_stop_when_the_evaluation_stops_improving_are_not_stale() -> None:
    assert _run(overfits, lambda step, new_best: new_best) == []


def test_saves_every_interval_that_stop_are_stale_and_say_the_gap_they_measured() -> None:
    # saves every 250 steps stop at 1000 while the evaluation still improves (new bests at 1250, 1500 unsaved)
    found = _run(overfits, lambda step, new_best: step <= 1000)
    assert found  # (the engine keeps a rule's first finding; the rule says it at every step after)
    f = found[0]
    assert f.code == "TG526" and f.evidence["last_checkpoint_step"] == 1000
    since = f.evidence["steps_since"]
    assert f"from step 1000 to step {1000 + since} ({since} steps)" in f.summary
