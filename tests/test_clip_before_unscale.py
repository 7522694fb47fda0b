"""TG304 clip-before-unscale (issue 31, item 5): a gradient norm pinned at max_norm / loss scale."""

from __future__ import annotations

import pytest

from trainguard.rules.numerics import ClipBeforeUnscale

pytestmark = pytest.mark.unit


def _feed(norms: list[float], scales: list[float]):
    rule = ClipBeforeUnscale({})
    for i, (g, s) in enumerate(zip(norms, scales), 1):
        found = rule.on_step({"step": i, "grad_norm": g, "loss_scale": s})
        if found is not None:
            return found
    return None


def test_a_norm_pinned_at_max_norm_over_the_scale_is_found_even_as_the_scale_halves() -> None:
    f = _feed([1 / 65536] * 3 + [1 / 32768] * 3, [65536.0] * 3 + [32768.0] * 3)
    assert f is not None and f.evidence["max_norm"] == 1.0 and "clipped to max_norm 1" in f.summary


def test_a_norm_pinned_at_max_norm_itself_is_the_right_order_and_is_quiet() -> None:
    assert _feed([0.9999991] * 10, [65536.0] * 10) is None


def test_natural_norms_and_an_unscaled_run_are_quiet() -> None:
    assert _feed([0.5 / 65536 * (1 + i / 10) for i in range(10)], [65536.0] * 10) is None
    assert _feed([1.0] * 10, [1.0] * 10) is None
