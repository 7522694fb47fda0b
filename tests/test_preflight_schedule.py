"""The LR schedule simulation (preflight/schedule.py) on real torch schedulers, and its findings.

Run: pytest tests/test_preflight_schedule.py
"""

from __future__ import annotations

import math

import pytest
import torch

from trainguard.preflight.schedule import schedule_findings, simulate


def _opt(lr: float = 1e-3) -> torch.optim.Optimizer:
    return torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=lr)


def _linear(opt: torch.optim.Optimizer, warmup: int, total: int) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: s / warmup if s < warmup else max(0.0, (total - s) / (total - warmup)))


def _names(sim: dict) -> list[str]:
    return [f.name for f in schedule_findings(sim)]


def test_seed002_schedule_stepped_per_microbatch_ends_early() -> None:
    # sized for 4687 optimizer steps, stepped once per micro-batch with accumulation 16
    sim = simulate(_linear(_opt(), 468, 4687), ratio=16, offset=0, total_steps=4687, grad_accum=16)
    found = schedule_findings(sim)
    assert [f.name for f in found] == ["schedule-ends-early"]
    assert abs(found[0].step - (math.ceil(4687 / 16) + 1)) <= 3  # the LR is zero from there on
    assert "94%" in found[0].summary and "once per micro-batch" in found[0].summary
    assert sim["curve"][0] == [1, 0.0] and len(sim["curve"]) <= 1002


def test_cosine_sized_in_microbatches_ends_late() -> None:
    # just past its peak a cosine changes slowly: the simulation must not take that for the schedule's end
    from trainguard.demo.tinylm import cosine_with_warmup

    sim = simulate(cosine_with_warmup(_opt(), warmup=400, total=4000), ratio=1, offset=0, total_steps=500,
                   grad_accum=8)
    assert [f.name for f in schedule_findings(sim)] == ["schedule-ends-late"] and sim["schedule_end"] > 3500


def test_schedule_sized_in_microbatches_ends_late() -> None:
    sim = simulate(_linear(_opt(), 800, 8000), ratio=1, offset=0, total_steps=1000, grad_accum=8)
    found = schedule_findings(sim)
    assert [f.name for f in found] == ["schedule-ends-late"]
    assert sim["schedule_end"] >= 7900 and sim["final_lr"] > 0.9e-3


@pytest.mark.parametrize("make", [
    lambda o: _linear(o, 100, 1000),
    lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=1000, eta_min=1e-4),
    lambda o: torch.optim.lr_scheduler.OneCycleLR(o, max_lr=1e-3, total_steps=1000),
    lambda o: torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(o, T_0=200),  # periodic: never "ends"
    lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda s: 1.0),  # constant
    lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=400, gamma=0.5),
    lambda o: torch.optim.lr_scheduler.MultiStepLR(o, milestones=[500, 750], gamma=0.1),  # last quarter flat
])
def test_healthy_schedules_are_quiet(make) -> None:
    opt = _opt()
    sim = simulate(make(opt), ratio=1, offset=0, total_steps=1000, grad_accum=1)
    assert _names(sim) == [], sim


def test_zero_learning_rate_is_an_early_end() -> None:
    sim = simulate(torch.optim.lr_scheduler.LambdaLR(_opt(0.0), lambda s: 1.0), ratio=1, offset=0,
                   total_steps=100, grad_accum=1)
    assert _names(sim) == ["schedule-ends-early"]


def test_scheduler_that_raises_within_the_plan() -> None:
    # OneCycleLR sized for 1000 optimizer steps, stepped per micro-batch with accumulation 4
    sched = torch.optim.lr_scheduler.OneCycleLR(_opt(), max_lr=1e-3, total_steps=1000)
    found = schedule_findings(simulate(sched, ratio=4, offset=0, total_steps=1000, grad_accum=4))
    assert [(f.name, f.cause) for f in found] == [("schedule-ends-early", "scheduler-raises")]
    assert 249 <= found[0].step <= 252 and "ValueError" in found[0].summary


def test_skips_what_it_cannot_simulate() -> None:
    opt = _opt()
    assert simulate(_linear(opt, 1, 10), ratio=1, offset=0, total_steps=None, grad_accum=1)["skipped"]
    assert simulate(_linear(opt, 1, 10), ratio=0, offset=0, total_steps=10, grad_accum=1)["skipped"]
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt)
    assert simulate(plateau, ratio=1, offset=0, total_steps=10, grad_accum=1)["skipped"]
