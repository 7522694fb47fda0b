"""The LR schedule simulation (preflight/schedule.py) on real torch schedulers, and its findings.

Run: pytest tests/test_preflight_schedule.py
"""

from __future__ import annotations

import math

import pytest
import torch

from trainguard.preflight.schedule import schedule_findings
from trainguard.probe.schedsim import simulate


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


# -- every schedule (issue 15): composites, Hugging Face, an LR set by hand --------------------------------

def _seq(opt: torch.optim.Optimizer, warmup: int, t_max: int) -> torch.optim.lr_scheduler.SequentialLR:
    lr = torch.optim.lr_scheduler
    return lr.SequentialLR(opt, [lr.LinearLR(opt, start_factor=0.01, total_iters=warmup),
                                 lr.CosineAnnealingLR(opt, T_max=t_max)], milestones=[warmup])


def test_sequential_warmup_cosine_sized_in_microbatches_ends_late() -> None:
    sim = simulate(_seq(_opt(), 80, 1520), ratio=1, offset=0, total_steps=200, grad_accum=8)
    found = schedule_findings(sim)
    assert [f.name for f in found] == ["schedule-ends-late"], sim
    assert found[0].evidence["schedule_end"] == 1601 and sim["final_lr"] > 0.9e-3
    assert sim["schedulers"] == ["SequentialLR", "LinearLR", "CosineAnnealingLR"]


def test_chained_cosine_that_ends_high_ends_late() -> None:
    # the seed of the issue: the LR ends at 96% of its peak and preflight passed
    lr = torch.optim.lr_scheduler
    opt = _opt()
    sched = lr.ChainedScheduler([lr.LinearLR(opt, start_factor=0.1, total_iters=10),
                                 lr.CosineAnnealingLR(opt, T_max=1920)])
    sim = simulate(sched, ratio=1, offset=0, total_steps=240, grad_accum=8)
    found = schedule_findings(sim)
    assert [f.name for f in found] == ["schedule-ends-late"] and "96% of its peak" in found[0].summary


def test_a_cosine_that_falls_to_zero_again_and_again() -> None:
    sim = simulate(_seq(_opt(), 5, 30), ratio=1, offset=0, total_steps=240, grad_accum=1)
    found = schedule_findings(sim)
    assert [f.name for f in found] == ["lr-cycles-to-zero"], sim
    assert found[0].evidence["zeros_in_plan"] == 4 and found[0].step == 35


@pytest.mark.parametrize("make", [
    lambda o: _seq(o, 10, 190),
    lambda o: torch.optim.lr_scheduler.CosineAnnealingWarmRestarts(o, T_0=20),  # restarts by design
    lambda o: torch.optim.lr_scheduler.CyclicLR(o, base_lr=1e-7, max_lr=1e-3, step_size_up=20),
    lambda o: torch.optim.lr_scheduler.ChainedScheduler([
        torch.optim.lr_scheduler.LinearLR(o, start_factor=0.1, total_iters=10),
        torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=200)]),
])
def test_healthy_composites_and_cycles_by_design_are_quiet(make) -> None:
    assert _names(simulate(make(_opt()), ratio=1, offset=0, total_steps=200, grad_accum=1)) == []


def test_hugging_face_schedules_sized_in_microbatches() -> None:
    transformers = pytest.importorskip("transformers")
    # stepped per micro-batch, HF's cosine does not stay at zero past its end: it climbs back (its lambda is
    # periodic past num_training_steps), so the LR cycles through zero; the linear one stays at zero
    for name, per_micro_finding in (("get_cosine_schedule_with_warmup", "lr-cycles-to-zero"),
                                    ("get_linear_schedule_with_warmup", "schedule-ends-early")):
        make = getattr(transformers, name)
        ok = simulate(make(_opt(), num_warmup_steps=50, num_training_steps=1000), ratio=1, offset=0,
                      total_steps=1000, grad_accum=8)
        assert _names(ok) == [], (name, ok)
        micro = simulate(make(_opt(), num_warmup_steps=400, num_training_steps=8000), ratio=1, offset=0,
                         total_steps=1000, grad_accum=8)
        assert _names(micro) == ["schedule-ends-late"], name
        per_micro = simulate(make(_opt(), num_warmup_steps=50, num_training_steps=1000), ratio=8, offset=0,
                             total_steps=1000, grad_accum=8)
        assert _names(per_micro) == [per_micro_finding], name


def test_an_lr_set_by_hand_is_found_checked_and_simulated() -> None:
    import types

    from trainguard.probe.fastforward import find_lr_function
    from trainguard.probe.schedsim import simulate_function

    def get_lr(it: int) -> float:  # nanoGPT's shape, decaying over 60 of 240 iterations to 0
        if it < 10:
            return 3e-3 * (it + 1) / 11
        if it > 60:
            return 0.0
        return 0.5 * (1 + math.cos(math.pi * (it - 10) / 50)) * 3e-3

    def lr_of_layer(name: str, scale: float = 1.0) -> float:  # named for the LR, but not a schedule
        return 1e-3

    script = types.ModuleType("__main__")
    get_lr.__module__ = lr_of_layer.__module__ = "__main__"
    script.get_lr, script.lr_of_layer = get_lr, lr_of_layer
    seen = {k: get_lr(k - 1) for k in range(1, 5)}  # optimizer step k ran with get_lr(iter_num = k - 1)
    fn, shift = find_lr_function(script, seen)
    assert fn is get_lr and shift == -1
    assert find_lr_function(script, {k: 5e-4 for k in range(1, 5)}) is None  # reproduces nothing seen
    sim = simulate_function(fn, shift=shift, total_steps=240, grad_accum=1, name="get_lr")
    found = schedule_findings(sim)
    assert [f.name for f in found] == ["schedule-ends-early"] and "get_lr()" in found[0].summary


# timm is not installed here: this reproduces the interface of timm.scheduler.CosineLRScheduler that the
# probe relies on (t_initial, warmup_t, t_in_epochs, cycle_limit, step_update(num_updates), _get_lr(t)) and
# its cosine-with-linear-warmup formula, so the probe's timm path runs end to end in a real preflight.
TIMM_LIKE = '''
import math, sys, torch, trainguard


class CosineLRScheduler:
    def __init__(self, optimizer, t_initial, lr_min=0.0, warmup_t=0, warmup_lr_init=0.0, t_in_epochs=True,
                 cycle_limit=1):
        self.optimizer, self.t_initial, self.lr_min = optimizer, t_initial, lr_min
        self.warmup_t, self.warmup_lr_init, self.t_in_epochs, self.cycle_limit = warmup_t, warmup_lr_init, t_in_epochs, cycle_limit
        self.base_values = [g["lr"] for g in optimizer.param_groups]
        self.warmup_steps = [(v - warmup_lr_init) / warmup_t for v in self.base_values] if warmup_t else [1]
        self.step_update(0) if not t_in_epochs else None

    def _get_lr(self, t):
        if t < self.warmup_t:
            return [self.warmup_lr_init + t * s for s in self.warmup_steps]
        i, t_curr = t // self.t_initial, t % self.t_initial
        if i >= self.cycle_limit:
            return [self.lr_min for _ in self.base_values]
        return [self.lr_min + 0.5 * (v - self.lr_min) * (1 + math.cos(math.pi * t_curr / self.t_initial))
                for v in self.base_values]

    def step(self, epoch, metric=None):
        if self.t_in_epochs:
            for g, lr in zip(self.optimizer.param_groups, self._get_lr(epoch)):
                g["lr"] = lr

    def step_update(self, num_updates, metric=None):
        if not self.t_in_epochs:
            for g, lr in zip(self.optimizer.param_groups, self._get_lr(num_updates)):
                g["lr"] = lr


torch.manual_seed(0)
steps, accum = 200, 8
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
t_initial = steps * accum if "--micro" in sys.argv else steps  # sized in micro-batches: never anneals
sched = CosineLRScheduler(opt, t_initial=t_initial, warmup_t=10, warmup_lr_init=1e-4, t_in_epochs=False)
guard = trainguard.watch(model, opt, sched, total_steps=steps, grad_accum=accum)
updates = 0
for micro in range(1, steps * accum + 1):
    x = torch.randn(16, 8)
    loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
    (loss / accum).backward()
    guard.step(loss)
    if micro % accum == 0:
        opt.step(); opt.zero_grad(); updates += 1
        sched.step_update(num_updates=updates)
guard.finish()
'''


@pytest.mark.parametrize("micro, expected", [(False, []), (True, ["schedule-ends-late"])])
def test_a_timm_style_scheduler_is_simulated_per_update(tmp_path, micro: bool, expected: list[str]) -> None:
    import json
    import sys

    from tgtest import run_trainguard

    from trainguard.probe.planinfo import is_timm, sched_horizon

    (tmp_path / "train.py").write_text(TIMM_LIKE)
    args = ["--micro"] if micro else []
    proc = run_trainguard("preflight", "--quiet", "--run-dir", str(tmp_path / "pf"), "--", sys.executable, "train.py",
                          *args, cwd=tmp_path, timeout=180)
    status = json.loads((tmp_path / "pf" / "status.json").read_text())
    sim = json.loads((tmp_path / "pf" / "schedule.json").read_text())
    assert sim.get("timm") and "skipped" not in sim, sim
    assert [f["name"] for f in status["findings"] if f["source"] == "preflight"] == expected, proc.stderr
    assert proc.returncode == (1 if expected else 0)
    namespace: dict = {}
    exec(TIMM_LIKE.split("torch.manual_seed(0)")[0], namespace)
    sched = namespace["CosineLRScheduler"](_opt(), t_initial=300, t_in_epochs=False, cycle_limit=2)
    assert is_timm(sched) and sched_horizon(sched) == 600


def test_a_scheduler_without_a_step_count_is_said_unchecked(tmp_path) -> None:
    import json
    import sys

    from tgtest import run_trainguard

    (tmp_path / "train.py").write_text(TIMM_LIKE.replace("t_in_epochs=False)", "t_in_epochs=True)"))
    proc = run_trainguard("preflight", "--quiet", "--run-dir", str(tmp_path / "pf"), "--", sys.executable, "train.py",
                          cwd=tmp_path, timeout=180)
    sim = json.loads((tmp_path / "pf" / "schedule.json").read_text())
    assert "counts epochs" in sim["skipped"] and "not checked" in proc.stderr, proc.stderr


HAND_LR_INLINE = '''
import torch, trainguard

torch.manual_seed(0)
steps = 200
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
guard = trainguard.watch(model, opt, total_steps=steps)
for step in range(steps):
    for group in opt.param_groups:  # the LR set by hand, inline: no function of the script to call
        group["lr"] = 0.1 * (1 - step / steps) ** 2
    x = torch.randn(16, 8)
    loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
    loss.backward()
    opt.step(); opt.zero_grad()
    guard.step(loss)
guard.finish()
'''


def test_an_inline_hand_set_lr_is_not_checked_so_not_passed(tmp_path) -> None:
    # printed "the LR schedule was not checked" and then "passed", exit 0: never claim what was not checked
    import json
    import sys

    from tgtest import run_trainguard

    (tmp_path / "train.py").write_text(HAND_LR_INLINE)
    proc = run_trainguard("preflight", "--quiet", "--run-dir", str(tmp_path / "pf"), "--", sys.executable, "train.py",
                          cwd=tmp_path, timeout=180)
    status = json.loads((tmp_path / "pf" / "status.json").read_text())
    assert "set by hand" in json.loads((tmp_path / "pf" / "schedule.json").read_text())["skipped"]
    assert status["preflight_outcome"] == "incomplete" and proc.returncode == 3, proc.stderr
    assert "incomplete" in proc.stderr and "not checked" in proc.stderr and "passed" not in proc.stderr
    # the same loop at a constant LR has no schedule to check: it passes
    (tmp_path / "train.py").write_text(HAND_LR_INLINE.replace("* (1 - step / steps) ** 2", ""))
    proc = run_trainguard("preflight", "--quiet", "--run-dir", str(tmp_path / "pf"), "--", sys.executable, "train.py",
                          cwd=tmp_path, timeout=180)
    assert proc.returncode == 0 and "passed" in proc.stderr, proc.stderr
