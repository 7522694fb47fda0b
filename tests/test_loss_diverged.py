"""TG208 loss-diverged (issue 31, item 2): divergence without NaN, judged from the update itself."""

from __future__ import annotations

import math
import random

import pytest

from trainguard.rules.divergence import LossDiverged

pytestmark = pytest.mark.unit


def _feed(plan: dict, rows: list[tuple[float, float | None]]):
    rule = LossDiverged(plan)
    for step, (loss, ratio) in enumerate(rows, 1):
        found = rule.on_step({"step": step, "loss": loss, "lr": 2.0, "update_ratio": ratio, "grad_norm": 1.0})
        if found is not None:
            return found
    return None


def test_an_lr_far_too_high_is_found_within_a_few_steps() -> None:
    losses = [5.85, 31.5, 326, 88.6, 56.3, 181, 191, 190, 240, 240]
    ratios = [3.02, 0.65, 0.35, 0.24, 0.17, 0.13, 0.11, 0.09, 0.08, 0.07]
    f = _feed({"output_size": 256}, list(zip(losses, ratios)))
    assert f is not None and f.evidence["detected_step"] <= 7 and "the LR is far too high" in f.summary


def test_a_noisy_regression_whose_weights_shrink_to_zero_is_no_divergence() -> None:
    # the first loss a lucky low draw (0.0108 against a level near 0.2); ratios large as the weights shrink
    rng = random.Random(0)
    rows = [(0.0108, 0.045), (0.35, 0.39), (0.21, 0.24)] + [(abs(rng.gauss(0.2, 0.1)), 0.2) for _ in range(60)]
    assert _feed({"output_size": 1}, rows) is None


def test_a_loss_high_but_learning_and_a_loss_climbing_with_small_updates_are_quiet() -> None:
    assert _feed({"output_size": 256}, [(5.85 - i * 0.05, 0.16) for i in range(40)]) is None
    assert _feed({}, [(1.0 * math.exp(i / 5), 1e-3) for i in range(40)]) is None


def test_a_crash_after_the_loss_diverged_names_it_and_the_lr_and_one_without_stays_as_it_was() -> None:
    from trainguard.findings import Finding
    from trainguard.rules.crash import after_divergence, crash_finding

    diverged = Finding(code="TG208", name="loss-diverged", severity="error", summary="...", step=2,
                       evidence={"lr": 2.0})
    crashed = crash_finding(exception="RuntimeError", message="Model diverged with loss = 257.0", frames=[], step=42)
    after_divergence(crashed, [diverged])
    assert "it came after loss-diverged (TG208) from step 2 at lr 2" in crashed.summary
    assert crashed.fix.startswith("The loss was diverging before the crash")
    plain = crash_finding(exception="TypeError", message="bad operand", frames=[], step=42)
    before = (plain.summary, plain.fix)
    after_divergence(plain, [])
    assert (plain.summary, plain.fix) == before
