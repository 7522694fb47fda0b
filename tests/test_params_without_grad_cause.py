"""TG202 params-without-grad writes its fix per cause (issue 31, item 7)."""

from __future__ import annotations

import warnings

import pytest

from trainguard.rules.progress import ParamsWithoutGrad

pytestmark = pytest.mark.unit


def _feed(extra: dict):
    rule = ParamsWithoutGrad({})
    for step in range(1, 6):
        found = rule.on_step({"step": step, "grad_norm": 1.0, "extra": {"params_without_grad": 4, **extra}})
    return found


def test_adapters_without_gradients_under_reentrant_checkpointing_are_not_told_to_freeze() -> None:
    f = _feed({"checkpoint_inputs_no_grad": True})
    assert f.cause == "reentrant-checkpoint" and "use_reentrant=False" in f.fix and "do not freeze" in f.fix


def test_the_generic_cause_keeps_its_own_fix() -> None:
    f = _feed({})
    assert f.cause == "never-grad" and "requires_grad_(False) what is frozen on purpose" in f.fix


def test_the_probe_reads_torchs_own_checkpoint_warning_from_its_registry() -> None:
    torch = pytest.importorskip("torch")
    from torch.utils.checkpoint import checkpoint

    from trainguard.probe.opthooks import _checkpoint_warned

    lin = torch.nn.Linear(2, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("default")
        checkpoint(lin, torch.randn(1, 2), use_reentrant=True)
    assert _checkpoint_warned()
