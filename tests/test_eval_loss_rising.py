"""TG209 eval-loss-rising: an evaluation loss that doubled from its best while the training loss kept falling.

Rows and evaluations are fed as the readers and the probe hand them to the rules (a step row's `loss`, an
`eval` event's `data.loss`); the zoo's diagnose_nanogpt_overfits / _plateaus run the same through nanoGPT's
console.
"""

from __future__ import annotations

import math

import pytest

from trainguard.rules.overfit import EvalLossRising

pytestmark = pytest.mark.unit


def _run(train, val, steps: int = 5000, every: int = 250):
    rule = EvalLossRising({})
    found = []
    for step in range(steps + 1):
        if (f := rule.on_step({"step": step, "loss": train(step)})) is not None:
            found.append(f)
        if step % every == 0 and (f := rule.on_event({"kind": "eval", "step": step, "data": {"loss": val(step)}})):
            found.append(f)
    return found


def falling(step: int) -> float:
    return 4.0 * math.exp(-step / 300) + 0.2 + 0.8 * math.exp(-step / 2000)


def test_an_evaluation_loss_that_doubles_while_training_falls_is_overfitting() -> None:
    found = _run(falling, lambda s: 4.0 * math.exp(-s / 300) + 1.5 + max(0.0, (s - 1250) / 1250))
    assert len(found) == 1
    f = found[0]
    assert f.code == "TG209" and f.evidence["best"]["step"] in (1250, 1500) and f.evidence["ratio"] >= 2
    assert "overfits" in f.summary and f.evidence["last"][-1]["train_loss"] < f.evidence["best"]["train_loss"]


def test_an_evaluation_loss_that_creeps_up_a_third_is_quiet() -> None:
    # fine-tuning past the task's best: eval loss 0.32 -> 0.42 while the training loss falls
    assert _run(falling, lambda s: 0.32 + 0.1 * max(0.0, s - 1000) / 4000) == []


def test_both_losses_rising_is_divergence_not_overfitting() -> None:
    rising = lambda s: falling(min(s, 1500)) + max(0.0, (s - 1500) / 300)  # noqa: E731
    assert _run(rising, lambda s: 1.0 + max(0.0, (s - 1500) / 200)) == []


def test_one_low_evaluation_now_and_then_is_no_best_to_rise_from() -> None:
    # a small validation set: a flat 1.0 with one lucky batch at 0.4 every seventh evaluation; judged one
    # by one, 1.0 would be 2.5x a best of 0.4, three times in a row
    assert _run(falling, lambda s: 0.4 if (s // 250) % 7 == 3 else 1.0) == []


def test_an_evaluation_loss_rising_with_a_training_loss_of_its_size_is_no_memorising() -> None:
    # a linear probe at a high LR: test loss 4 -> 10 while the training loss falls 11 -> 6 (and its test
    # accuracy still improves): unstable, not memorised
    assert _run(lambda s: 11.0 - 5.0 * s / 5000, lambda s: 4.0 + 6.0 * max(0.0, s - 1500) / 3500) == []


def test_a_best_at_one_of_the_last_evaluations_is_no_rise() -> None:
    # a noisy evaluation whose lowest value comes late: nothing to climb from
    assert _run(falling, lambda s: 3.0 if s < 4500 else 1.0) == []


def test_an_evaluations_batches_at_one_step_are_one_evaluation() -> None:
    # `Test: [i/242] Loss X` lines, each an evaluation event at the same step: batch losses 1.1-7.5 around a
    # flat mean; judged one by one, the lucky batches make a best that the next batches "double"
    rule = EvalLossRising({})
    found = []
    batches = [3.5, 7.5, 4.9, 1.1, 2.2, 6.0, 3.0, 2.4]
    for step in range(1, 6001):
        rule.on_step({"step": step, "loss": falling(step)})
        if step % 250 == 0:
            for b in batches:
                if (f := rule.on_event({"kind": "eval", "step": step, "data": {"loss": b}})) is not None:
                    found.append(f)
    assert rule.end() is None and found == []
