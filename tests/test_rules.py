"""The health rules: catalogue pages, the engine, `trainguard diagnose`, and the probe running rules alone.

Run: pytest tests/test_rules.py
Each rule's firing and quiet behaviour on real training runs is tested by its scenarios in the zoo
(tests/test_zoo.py); here are the engine's own contracts and the commands around it.
"""

from __future__ import annotations

import collections
import json
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
from tgtest import run_trainguard

from trainguard.catalog import CATALOG, lookup
from trainguard.rules.engine import Engine, Rule, all_rules, run_rules

SECTIONS = ("## What it detects", "## Why it matters", "## Example", "## What to change",
            "## Known false positives", "## Options")

LR_ZERO_SCRIPT = textwrap.dedent('''
    import torch, trainguard
    torch.manual_seed(0); torch.set_num_threads(1)
    model = torch.nn.Linear(8, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    # planned 100 steps, but the schedule is over after 20: LR 0 for the other 80%
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: max(0.0, 1 - s / 20))
    guard = trainguard.watch(model, opt, sched, total_steps=100)
    x, y = torch.randn(256, 8), torch.randint(4, (256,))
    for step in range(1, 101):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward(); opt.step(); sched.step(); opt.zero_grad()
        guard.step(loss)
    guard.finish()
''')


def test_every_health_rule_has_a_page_and_matches_its_entry() -> None:
    rules = all_rules()
    assert len(rules) >= 24
    codes = [e.code for e in CATALOG]
    assert len(codes) == len(set(codes)), "a code is used twice"
    for entry in CATALOG:
        obj = entry.resolve()
        if not (isinstance(obj, type) and issubclass(obj, Rule)):
            continue
        assert (obj.code, obj.name, obj.severity) == (entry.code, entry.name, entry.severity)
        assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)+", entry.name)
        doc = entry.doc()
        for section in SECTIONS:
            assert section in doc, f"{entry.code} {entry.name}: page lacks {section!r}"
        assert entry.headline() and not entry.headline().startswith("TG")


def test_issue_names_are_all_in_the_catalogue() -> None:
    names = """lr-reaches-zero schedule-horizon-mismatch weights-not-updating params-without-grad
        eval-metrics-frozen loss-not-decreasing initial-loss-off loss-diverging loss-spike nonfinite-loss
        nonfinite-grad grad-scaler-collapse loss-parts-imbalanced loss-part-vanished loss-parts-dont-sum
        loss-weight-stalled expert-collapse perplexity-implausible log-flood throughput-drop
        data-wait-dominant memory-creep device-memory-near-full checkpoint-stale""".split()
    for name in names:
        assert lookup(name).name == name


def _steps(lrs: list[float], **extra: object) -> list[dict]:
    return [{"kind": "step", "step": i, "t": float(i), "lr": lr, "loss": 1.0, **extra}
            for i, lr in enumerate(lrs, 1)]


def test_lr_zero_names_its_onset_and_the_share_left() -> None:
    events = _steps([1e-3] * 30 + [0.0] * 70)
    found = {f.name: f for f in run_rules(events, {"total_steps": 100})}
    f = found["lr-reaches-zero"]
    assert f.step == 31 and f.evidence["detected_step"] == 40
    assert f.evidence["fraction_left"] == pytest.approx(0.70)
    assert "70% of the planned 100 steps are left" in f.summary


def test_a_schedule_that_decays_to_zero_at_its_end_is_quiet() -> None:
    n = 200
    lrs = [1e-3 * (1 - s / n) for s in range(n)]  # linear to exactly 0 at the last step
    assert [f.name for f in run_rules(_steps(lrs), {"total_steps": n})
            if f.name == "lr-reaches-zero"] == []


def test_the_classic_step_schedule_is_not_an_lr_at_zero() -> None:
    lrs = [0.1] * 30 + [0.01] * 30 + [0.001] * 20 + [0.0001] * 20  # 0.1 -> 1e-4 of its peak, on purpose
    assert "lr-reaches-zero" not in [f.name for f in run_rules(_steps(lrs), {"total_steps": 100})]


def test_eval_frozen_fires_at_the_third_identical_evaluation() -> None:
    evals = [{"kind": "eval", "step": s, "t": float(s), "data": {"loss": 101.4}} for s in (10, 20, 30)]
    engine = Engine({})
    assert engine.feed(evals[0]) == [] and engine.feed(evals[1]) == []
    (f,) = engine.feed(evals[2])
    assert f.name == "eval-metrics-frozen" and f.step == 10 and f.evidence["detected_step"] == 30


def _evals(losses: list[float], accs: list[float], every: int = 50) -> list[dict]:
    return [{"kind": "eval", "step": every * (i + 1), "t": float(i), "data": {"loss": lo, "accuracy": a}}
            for i, (lo, a) in enumerate(zip(losses, accs))]


def test_one_eval_metric_frozen_while_others_move_is_found_per_metric() -> None:
    """Real shape (a 4-way QA model that never learned): eval loss at ln 4 to 6 digits, accuracy jittering."""
    import math
    import random

    rng = random.Random(0)
    accs = [0.25 + rng.uniform(-0.03, 0.03) for _ in range(12)]
    frozen = [math.log(4) + rng.uniform(-2e-6, 2e-6) for _ in range(12)]
    found = [f for f in run_rules(_evals(frozen, accs), {"total_steps": 600}) if f.name == "eval-metrics-frozen"]
    assert len(found) == 1 and found[0].evidence["uniform_classes"] == 4 and "ln(4)" in found[0].summary
    # healthy twin: the loss falls slowly (by 1e-3 an evaluation), accuracy jitters the same way
    moving = [1.2 - 1e-3 * i for i in range(12)]
    assert [f for f in run_rules(_evals(moving, accs), {"total_steps": 600}) if f.name == "eval-metrics-frozen"] == []


def test_frozen_loss_after_the_schedule_decayed_is_not_judged_per_metric() -> None:
    """At the end of a linear decay the weights settle on purpose: the eval loss may repeat to 5 digits."""
    evals = [{"kind": "eval", "step": s, "t": float(s), "data": {"loss": 0.41234, "accuracy": 0.8 + 1e-3 * i}}
             for i, s in enumerate(range(572, 601, 4))]
    def stream(peak_lr_at_end: bool) -> list[dict]:
        steps = [{"kind": "step", "step": s, "t": float(s), "loss": 0.5,
                  "lr": 1e-3 if peak_lr_at_end else 1e-3 * (1 - s / 600)} for s in range(1, 601)]
        return sorted(steps + evals, key=lambda e: (e["step"], e["kind"] == "eval"))
    def frozen(events: list[dict]) -> list:
        return [f for f in run_rules(events, {"total_steps": 600}) if f.name == "eval-metrics-frozen"]
    assert frozen(stream(peak_lr_at_end=False)) == []
    assert len(frozen(stream(peak_lr_at_end=True))) == 1  # the same evaluations at full LR: frozen


def test_plateau_window_is_counted_in_steps_not_rows() -> None:
    """A loss logged every 50 of 3,140 steps, flat at ln 4: 62 rows, a window of 157 steps."""
    rows = [{"kind": "step", "step": 50 * i, "t": float(i), "loss": 1.3863 + 0.004 * ((-1) ** i)} for i in range(1, 63)]
    assert "loss-not-decreasing" in [f.name for f in run_rules(rows, {"total_steps": 3140})]
    falling = [dict(r, loss=1.3863 * (1 - r["step"] / 6000)) for r in rows]
    assert "loss-not-decreasing" not in [f.name for f in run_rules(falling, {"total_steps": 3140})]


def test_a_job_that_does_not_train_is_not_judged_for_learning() -> None:
    """`watch(learning=False)` (a teacher writing its cache, an evaluation): a flat per-batch NLL is what such a
    job reports; the same rows from a training run are loss-not-decreasing."""
    rows = [{"kind": "step", "step": i, "t": float(i), "loss": 9.0 + 0.05 * ((i * 7919) % 13 - 6) / 6}
            for i in range(1, 301)]
    assert "loss-not-decreasing" in [f.name for f in run_rules(rows, {"total_steps": 300})]
    assert run_rules(rows, {"total_steps": 300, "learning": False}) == []


def _curriculum(lm_end: float, kd_end: float, n: int = 300) -> list[dict]:
    """A distillation student as the recipe reports it: parts lm and kd, the kd weight ramping 0.1 -> 0.7 over
    the first 20% of the run, the total their weighted sum, step-to-step noise from a fixed pattern."""
    rows = []
    for step in range(1, n + 1):
        w = 0.1 + 0.6 * min(1.0, step / (0.2 * n))
        f = step / n
        lm = 7.6 + (lm_end - 7.6) * f + 0.2 * ((step * 7919) % 13 - 6) / 6
        kd = 9.0 + (kd_end - 9.0) * f + 0.2 * ((step * 104729) % 11 - 5) / 5
        rows.append({"kind": "step", "step": step, "t": float(step), "loss": (1 - w) * lm + w * kd,
                     "parts": {"lm": lm, "kd": kd}, "weights": {"lm": 1 - w, "kd": w}})
    return rows


def test_a_curriculum_that_shifts_weight_to_a_larger_part_is_judged_at_fixed_weights() -> None:
    """The KD weight ramps onto a part larger than the LM loss: the total barely moves over the first 50
    steps while both parts fall (the recipe's GPU students got TG204 this way). Judged at fixed weights it
    is learning; the same curriculum whose parts do not fall is still found, and says how it was judged."""
    healthy = _curriculum(lm_end=5.0, kd_end=6.0)
    early = healthy[:60]
    assert early[49]["loss"] > early[0]["loss"] - 0.2  # the weighted total alone does not show the learning
    assert "loss-not-decreasing" not in [f.name for f in run_rules(healthy, {"total_steps": 300})]
    stuck = [f for f in run_rules(_curriculum(lm_end=7.6, kd_end=9.0), {"total_steps": 300})
             if f.name == "loss-not-decreasing"]
    assert stuck and "at fixed weights (lm x 0.4, kd x 0.6)" in stuck[0].summary, stuck


def _spiky(seed: int, sigma: float, spikes: dict[int, float], n: int = 1500) -> list[dict]:
    """Per-batch losses falling from 3 to 0.3 with log-normal noise of `sigma`, times `spikes[step]`."""
    import math
    import random

    rng = random.Random(seed)
    return [{"kind": "step", "step": s, "t": float(s),
             "loss": (0.3 + 2.7 * math.exp(-s / 300)) * math.exp(rng.gauss(0, sigma)) * spikes.get(s, 1.0)}
            for s in range(1, n + 1)]


def test_spike_is_judged_against_the_runs_own_noise_tail() -> None:
    def spikes(rows: list[dict]) -> list:
        return [f for f in run_rules(rows, {"total_steps": len(rows)}) if f.name == "loss-spike"]
    # a fine-tune's per-batch losses: jumps of 5-10x are its ordinary noise, a 15x one is too (T5's log)
    assert spikes(_spiky(0, 0.8, {1136: 15.0})) == []
    # a smooth run: a 2x blip is not a spike, a 2,250x one is, and it is the one reported
    (f,) = spikes(_spiky(1, 0.03, {300: 2.0, 1200: 2250.0}))
    assert f.step == 1200 and f.evidence["ratio"] > 1000
    # a 20x spike first, then a 2,250x one: the larger is reported too, not hidden behind the first
    assert [f.step for f in spikes(_spiky(2, 0.03, {400: 20.0, 1200: 2250.0}))] == [400, 1200]


class _Broken(Rule):
    code, name, severity = "TG999", "always-raises", "warning"

    def on_step(self, row: dict) -> None:
        raise RuntimeError("boom")


def test_a_rule_that_raises_is_switched_off_and_the_others_go_on() -> None:
    from trainguard.rules.schedule import LrReachesZero

    engine = Engine({"total_steps": 100}, rules=[_Broken, LrReachesZero])
    found = engine.feed_all(_steps([1e-3] * 30 + [0.0] * 70))
    assert [f.name for f in found] == ["lr-reaches-zero"]
    assert len(engine.errors) == 1 and "always-raises" in engine.errors[0]


def _long_run(n: int):
    """n steps of a run that keeps every rule busy: streaks that never end (a NaN every 37 steps, a
    vanished and a zeroed loss part, parts that never add up, update ratios of 0, frozen evaluations,
    collapsed experts, creeping host memory, a full device), an LR still warming up, regular checkpoints,
    output line counts."""
    for s in range(1, n + 1):
        loss = float("nan") if s % 37 == 0 else 2.0 + 1.0 / (1 + s / 1000) + 0.01 * (s * 7919 % 13)
        parts = {"kd": 1.0 + 0.01 * (s % 7), "bal": 0.0} if s > 100 else {"kd": 1.0, "lm": 2.0, "bal": 0.5}
        yield {"kind": "step", "step": s, "t": float(s), "loss": loss, "lr": 1e-4 + s * 1e-9,
               "grad_norm": 1.0 + 0.01 * (s % 11), "update_ratio": 0.0 if s % 10 == 0 else None,
               "sched_epoch": float(s), "loss_scale": 1024.0, "parts": parts, "weights": {"kd": 1.0, "bal": 0.1},
               "extra": {}, "rank": 0, "step_time": 0.05, "data_wait": 0.001}
        if s % 100 == 0:
            yield {"kind": "eval", "step": s, "t": float(s), "data": {"loss": 2.5, "perplexity": 12.18}}
            yield {"kind": "output", "step": s, "t": float(s), "data": {"lines": 2 * s}}
        if s % 50 == 0:
            yield {"kind": "experts", "step": s, "t": float(s), "data": {"layer": 0, "load": [97, 1, 1, 1]}}
        if s % 500 in (0, 200):  # gaps of 200 and 300 steps
            yield {"kind": "checkpoint", "step": s, "t": float(s), "data": {}}
        if s % 20 == 0:  # memory samples: host RSS creeping up, the device 96% full
            yield {"kind": "sample", "step": s, "t": float(s),
                   "data": {"rss": 2**30 + 65536 * s, "dev_total": 80 * 2**30, "dev_free": 3 * 2**30,
                            "dev_reserved": 76 * 2**30, "dev_allocated": 70 * 2**30}}


def _retained(obj: object, seen: set[int]) -> int:
    """How many items the containers reachable from `obj` hold (what would grow with a log's length)."""
    if id(obj) in seen or isinstance(obj, (str, bytes, int, float, type(None), type)):
        return 0
    seen.add(id(obj))
    if isinstance(obj, dict):
        return len(obj) + sum(_retained(k, seen) + _retained(v, seen) for k, v in obj.items())
    if isinstance(obj, (list, tuple, set, frozenset, collections.deque)):
        return len(obj) + sum(_retained(v, seen) for v in obj)
    fields = [getattr(obj, a) for a in getattr(type(obj), "__slots__", ()) if hasattr(obj, a)]
    if hasattr(obj, "__dict__"):
        fields.append(vars(obj))
    return sum(_retained(f, seen) for f in fields)


def test_the_rules_keep_bounded_state_on_a_long_run() -> None:
    # A 1 GB log is 15+ million steps: a rule that keeps a value per step (or per streak step) would
    # hold them all, and from 30k to 120k steps its state would grow about 4x. Bounded state does not
    # grow; a thinned series (memory-creep's) may swing up to 1.7x as it halves and refills, so the bar
    # is 2x. The plan is long, so the rules that decide half-way through it are still collecting.
    engine = Engine({"total_steps": 1_000_000})
    events = _long_run(120_000)
    sizes = []
    for upto in (30_000, 120_000):
        for ev in events:
            engine.feed(ev)
            if ev["kind"] == "step" and ev["step"] == upto:
                break
        sizes.append({r.name: _retained(vars(r), set()) for r in engine.rules})
    grown = {name: (sizes[0][name], n) for name, n in sizes[1].items() if n > 2 * sizes[0][name] + 10}
    assert not grown, f"rule state grew from 30k to 120k steps (items held): {grown}"
    assert not engine.errors
    fired = {f[0] for f in engine._reported}
    assert {"nonfinite-loss", "loss-part-vanished", "eval-metrics-frozen", "expert-collapse", "memory-creep",
            "device-memory-near-full"} <= fired


def test_sched_horizon_is_read_from_the_usual_schedulers() -> None:
    import functools

    import torch

    from trainguard.demo.toys import warmup_linear
    from trainguard.probe.planinfo import output_size, sched_horizon

    def opt() -> torch.optim.Optimizer:
        return torch.optim.SGD(torch.nn.Linear(2, 3).parameters(), lr=0.1)

    lr = torch.optim.lr_scheduler
    assert sched_horizon(lr.OneCycleLR(opt(), max_lr=0.1, total_steps=77)) == 77
    assert sched_horizon(lr.CosineAnnealingLR(opt(), T_max=55)) == 55
    assert sched_horizon(lr.LinearLR(opt(), start_factor=0.1, total_iters=9)) is None  # a warmup, not a horizon
    assert sched_horizon(lr.LambdaLR(opt(), warmup_linear(10, 123))) == 123
    hf = functools.partial(lambda step, num_warmup_steps, num_training_steps: 1.0,
                           num_warmup_steps=5, num_training_steps=321)
    assert sched_horizon(lr.LambdaLR(opt(), hf)) == 321
    assert sched_horizon(lr.StepLR(opt(), step_size=5)) is None
    assert output_size(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 49152)), None) == 49152
    assert output_size(None, {"vocab_size": 32000}) == 32000
    conv_last = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Unflatten(1, (8, 1, 1)), torch.nn.Conv2d(8, 3, 1))
    assert output_size(conv_last, None) is None  # a detector's head: no class count to expect


@pytest.fixture(scope="module")
def lr_zero_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One script, run twice: alone (the probe runs the rules) and as a run from before the rules
    existed (TRAINGUARD_RULES=0: nothing but the raw store)."""
    base = tmp_path_factory.mktemp("lrzero")
    script = base / "train.py"
    script.write_text(LR_ZERO_SCRIPT)
    runs = {}
    for label, rules in (("alone", "1"), ("old", "0")):
        env = dict(os.environ, TRAINGUARD_RULES=rules, TRAINGUARD_RUNS_ROOT=str(base / "runs"))
        env.pop("TRAINGUARD_RUN_DIR", None)
        run_dir = base / label
        proc = subprocess.run([sys.executable, str(script)], cwd=base, env=env, capture_output=True, text=True,
                              timeout=120, input="")
        assert proc.returncode == 0, proc.stderr
        # `watch(run_dir=...)` is not used by the script: find the folder it made
        made = sorted((base / "runs").iterdir(), key=lambda p: p.stat().st_mtime)[-1]
        made.rename(run_dir)
        runs[label] = run_dir
        runs[f"{label}_stderr"] = proc.stderr  # type: ignore[assignment]
    return runs


def test_the_probe_runs_the_rules_itself_without_a_watchdog(lr_zero_runs: dict) -> None:
    status = json.loads((lr_zero_runs["alone"] / "status.json").read_text())
    names = {f["name"]: f for f in status["findings"]}
    assert "lr-reaches-zero" in names and names["lr-reaches-zero"]["source"] == "probe"
    assert "TG101 lr-reaches-zero [error]" in lr_zero_runs["alone_stderr"]


def test_the_probes_in_memory_feed_finds_what_the_store_replays(lr_zero_runs: dict) -> None:
    """The probe feeds its rules the rows it queues for the store, without reading them back; the same
    run read back from run.db by `trainguard diagnose` must give the same findings at the same steps."""
    status = json.loads((lr_zero_runs["alone"] / "status.json").read_text())
    live = sorted((f["name"], f["step"]) for f in status["findings"])
    replayed = json.loads(run_trainguard("diagnose", "--json", str(lr_zero_runs["alone"])).stdout)
    assert live and live == sorted((f["name"], f["step"]) for f in replayed)


def test_diagnose_reads_a_run_recorded_before_the_rules(lr_zero_runs: dict) -> None:
    old = lr_zero_runs["old"]
    status = json.loads((old / "status.json").read_text())
    assert status["findings"] == []  # nothing was found while it ran
    proc = run_trainguard("diagnose", str(old))
    assert proc.returncode == 1, proc.stdout + proc.stderr  # an error finding
    assert "TG101 lr-reaches-zero [error] at step 21" in proc.stdout
    assert "fix:" in proc.stdout
    as_json = json.loads(run_trainguard("diagnose", "--json", str(old)).stdout)
    f = next(f for f in as_json if f["name"] == "lr-reaches-zero")
    assert f["source"] == "diagnose" and f["evidence"]["fraction_left"] == pytest.approx(0.80)


def test_diagnose_bad_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    proc = run_trainguard("diagnose", str(tmp_path / "nope"))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    (tmp_path / "status.json").write_text("{}")
    proc = run_trainguard("diagnose", str(tmp_path))
    assert proc.returncode == 2 and "no run.db" in proc.stderr


def test_rules_command_explains_a_health_rule() -> None:
    proc = run_trainguard("rules", "loss-weight-stalled")
    assert proc.returncode == 0
    assert proc.stdout.startswith("loss-weight-stalled (TG404)")
    assert "## Why it matters" in proc.stdout and "6.7%" in proc.stdout
    data = json.loads(run_trainguard("rules", "TG101", "--json").stdout)
    assert data["name"] == "lr-reaches-zero" and data["severity"] == "error" and "## Example" in data["doc"]
    listing = run_trainguard("rules").stdout
    assert "TG812  perplexity-implausible" in listing


NAN_BATCH_SCRIPT = textwrap.dedent('''
    import torch, trainguard
    torch.manual_seed(0); torch.set_num_threads(1)
    model = torch.nn.Linear(8, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    def loader():
        for i in range(1, 61):
            x = torch.randn(16, 8)
            if i == 40:
                x[2, 3] = float("nan")  # the bad sample
            yield x, torch.randint(4, (16,))
    guard = trainguard.watch(model, opt, total_steps=60, run_dir="run")
    for x, y in guard.batches(loader()):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        guard.step(loss)
        if torch.isfinite(loss):
            loss.backward(); opt.step()
        opt.zero_grad()
    guard.finish()
''')


def _run_alone(tmp_path: Path, script: str) -> None:
    """`script` as train.py, run with no watchdog (the probe runs the rules itself); it must exit 0."""
    (tmp_path / "train.py").write_text(script)
    env = dict(os.environ, TRAINGUARD_RULES="1")
    env.pop("TRAINGUARD_RUN_DIR", None)
    proc = subprocess.run([sys.executable, "train.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_the_batch_of_a_nonfinite_loss_is_saved_for_replay(tmp_path: Path) -> None:
    import torch

    _run_alone(tmp_path, NAN_BATCH_SCRIPT)
    saved = torch.load(tmp_path / "run" / "nonfinite-step40.pt")
    (x, _), = saved["batches"]
    assert saved["step"] == 40 and torch.isnan(x[2, 3]) and torch.isfinite(x[0]).all()
    status = json.loads((tmp_path / "run" / "status.json").read_text())
    f = next(f for f in status["findings"] if f["name"] == "nonfinite-loss")
    assert f["step"] == 40 and "nonfinite-step40.pt" in f["summary"]


# A run alone (no watchdog): a NaN loss at step 300 (a few seconds in: the rules' cadence is steady by
# then), then training goes on; the script itself reads its status.json after each step and records how
# long the finding took to appear there.
LIVE_NAN_SCRIPT = textwrap.dedent('''
    import json, time, torch, trainguard
    torch.manual_seed(0); torch.set_num_threads(1)
    model = torch.nn.Linear(8, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    guard = trainguard.watch(model, opt, total_steps=2000, run_dir="run")
    t_nan = seen = None
    for step in range(1, 2001):
        loss = torch.nn.functional.cross_entropy(model(torch.randn(16, 8)), torch.randint(4, (16,)))
        if step == 300:
            loss = loss * float("nan")
            t_nan = time.time()
        guard.step(loss)
        if torch.isfinite(loss):
            loss.backward(); opt.step()
        opt.zero_grad()
        time.sleep(0.01)
        if t_nan is not None:
            try:
                status = json.load(open("run/status.json"))
            except (OSError, ValueError):
                continue
            if any(f["name"] == "nonfinite-loss" for f in status["findings"]):
                seen = {"after_s": time.time() - t_nan, "state": status["state"], "step": status["step"]}
                break
    json.dump(seen, open("seen.json", "w"))
    guard.finish()
''')


def test_a_run_alone_shows_a_nan_in_its_status_within_seconds(tmp_path: Path) -> None:
    """The probe's own rules (no watchdog) run off the training thread at a slow cadence; a NaN must still
    reach status.json while the run goes on, within seconds, and the final status must hold it too."""
    _run_alone(tmp_path, LIVE_NAN_SCRIPT)
    seen = json.loads((tmp_path / "seen.json").read_text())
    assert seen is not None, "the NaN never reached status.json while the run went on"
    assert seen["state"] == "running" and seen["step"] >= 300, seen
    assert seen["after_s"] < 6.0, seen  # ~1-3 s: a flush (0.5 s), a rules pass (2 s), the status rewrite
    final = json.loads((tmp_path / "run" / "status.json").read_text())
    assert final["state"] == "completed" and final["step"] > 300
    f = next(f for f in final["findings"] if f["name"] == "nonfinite-loss")
    assert f["step"] == 300 and f["source"] == "probe"


def test_stop_on_a_health_finding_ends_the_run_early(tmp_path: Path) -> None:
    # the LR schedule ends at step 20 of 400 planned; each step sleeps so the run would take 8 s
    script = LR_ZERO_SCRIPT.replace("range(1, 101)", "range(1, 401)").replace("total_steps=100", "total_steps=400")
    script = script.replace("guard.step(loss)", "guard.step(loss); __import__('time').sleep(0.02)")
    (tmp_path / "train.py").write_text(script)
    proc = run_trainguard("run", "--quiet", "--run-dir", str(tmp_path / "run"), "--stop-on", "lr-reaches-zero",
                          "--", sys.executable, "train.py", cwd=tmp_path)
    assert proc.returncode == 125, proc.stderr
    status = json.loads((tmp_path / "run" / "status.json").read_text())
    assert status["step"] < 300
    assert any(f["name"] == "lr-reaches-zero" and f["source"] == "rules" for f in status["findings"])
    assert "stopping the run on lr-reaches-zero" in proc.stderr


def test_sched_horizon_reads_through_composites() -> None:
    import torch

    from trainguard.probe.planinfo import sched_epoch, sched_horizon, sched_names

    opt = torch.optim.SGD(torch.nn.Linear(2, 3).parameters(), lr=0.1)
    lr = torch.optim.lr_scheduler
    warm = lr.LinearLR(opt, start_factor=0.1, total_iters=80)
    seq = lr.SequentialLR(opt, [warm, lr.CosineAnnealingLR(opt, T_max=1520)], milestones=[80])
    assert sched_horizon(seq) == 1600 and sched_names(seq) == ["SequentialLR", "LinearLR", "CosineAnnealingLR"]
    chained = lr.ChainedScheduler([lr.LinearLR(opt, start_factor=0.1, total_iters=10),
                                   lr.CosineAnnealingLR(opt, T_max=1920)])
    assert sched_horizon(chained) == 1920
    before = sched_epoch(chained)
    opt.step()
    chained.step()
    assert sched_epoch(chained) == before + 1  # ChainedScheduler keeps no count: its first scheduler's
    transformers = pytest.importorskip("transformers")
    hf = transformers.get_cosine_schedule_with_warmup(opt, num_warmup_steps=10, num_training_steps=999)
    assert sched_horizon(hf) == 999


def _lr_rows(sched, steps: int) -> list[dict]:
    import warnings

    rows = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for step in range(1, steps + 1):
            rows.append({"kind": "step", "step": step, "lr": sched.optimizer.param_groups[0]["lr"]})
            sched.optimizer.step()
            sched.step()
    return rows


@pytest.mark.parametrize("make, plan, fires", [
    # CosineAnnealingLR past its T_max climbs back: T_max = 30 in a 240-step run falls to zero 4 times
    (lambda o, lr: lr.CosineAnnealingLR(o, T_max=30), {"scheduler": "CosineAnnealingLR"}, "error"),
    (lambda o, lr: lr.CosineAnnealingLR(o, T_max=30), {}, "warning"),  # from a log: the type is unknown
    (lambda o, lr: lr.CosineAnnealingLR(o, T_max=240), {"scheduler": "CosineAnnealingLR"}, None),
    (lambda o, lr: lr.CosineAnnealingWarmRestarts(o, T_0=30), {"scheduler": "CosineAnnealingWarmRestarts"}, None),
    (lambda o, lr: lr.CosineAnnealingWarmRestarts(o, T_0=30), {}, None),  # jumps back up: a restart
    (lambda o, lr: lr.OneCycleLR(o, max_lr=0.1, total_steps=240), {"scheduler": "OneCycleLR"}, None),
])
def test_lr_cycles_to_zero(make, plan, fires) -> None:
    import torch

    opt = torch.optim.SGD(torch.nn.Linear(2, 3).parameters(), lr=0.1)
    rows = _lr_rows(make(opt, torch.optim.lr_scheduler), 240)
    found = [f for f in run_rules(rows, {"total_steps": 240, **plan}) if f.name == "lr-cycles-to-zero"]
    assert [f.severity for f in found] == ([fires] if fires else [])
    if fires:
        assert found[0].step in (30, 31) and 89 <= found[0].evidence["zero_again_step"] <= 91


def test_a_gross_horizon_mismatch_is_an_error() -> None:
    rows = [{"kind": "step", "step": s, "lr": 1e-3, "sched_epoch": s - 1} for s in range(1, 10)]
    base = {"total_steps": 240, "grad_accum": 8}
    sev = {h: [f.severity for f in run_rules(rows, {**base, "sched_horizon": h})
               if f.name == "schedule-horizon-mismatch"] for h in (1920, 400, 240, 30)}
    assert sev == {1920: ["error"], 400: ["warning"], 240: [], 30: ["error"]}


def test_a_rate_rule_that_escalates_is_one_finding_in_status(tmp_path: Path) -> None:
    # NaN losses at steps 40, 45 and 50 of 60: TG301 warns at 40 and errs once past 1%. status.json
    # listed TG301 twice (warning and error); it holds one, the error, with the warning as evidence.
    script = NAN_BATCH_SCRIPT.replace("if i == 40:", "if i in (40, 45, 50):")
    (tmp_path / "train.py").write_text(script)
    proc = run_trainguard("run", "--quiet", "--run-dir", str(tmp_path / "run"), "--", sys.executable, "train.py",
                          cwd=tmp_path)
    status = json.loads((tmp_path / "run" / "status.json").read_text())
    tg301 = [f for f in status["findings"] if f["code"] == "TG301"]
    assert [f["severity"] for f in tg301] == ["error"], (proc.stderr, status["findings"])
    assert tg301[0]["evidence"]["steps"][:2] == [40, 45]  # the rate passed 1% at the second
    earlier = tg301[0]["evidence"]["earlier"]
    assert [e["severity"] for e in earlier] == ["warning"] and earlier[0]["step"] == 40
    assert "first non-finite loss" in earlier[0]["summary"]
    codes = [f["code"] for f in status["findings"]]
    assert len(codes) == len(set(codes)), codes


def test_a_nonfinite_grad_with_no_loss_reported_says_so() -> None:
    events = [{"kind": "step", "step": i, "t": float(i), "lr": 1e-3, "grad_norm": 1.0 if i != 5 else float("nan")}
              for i in range(1, 11)]
    f = next(f for f in run_rules(events, {"total_steps": 10}) if f.code == "TG302")
    assert "None" not in f.summary and "the loss of this step was not reported" in f.summary, f.summary
    events[4]["loss"] = 2.31
    f = next(f for f in run_rules(events, {"total_steps": 10}) if f.code == "TG302")
    assert "while the loss is 2.31" in f.summary


@pytest.mark.parametrize("warmup, says_warmup", [(50, False), (400, True)])
def test_a_schedule_longer_than_the_run_names_only_what_is_cut_short(warmup: int, says_warmup: bool) -> None:
    # SequentialLR(linear warmup, cosine) sized for 1920 steps in a 240-step run: the decay never finishes;
    # the warmup only when it is longer than the run. TG102 said "warmup and decay never finish" for both.
    import torch

    from trainguard.probe.planinfo import sched_horizon, sched_warmup

    opt = torch.optim.SGD(torch.nn.Linear(2, 3).parameters(), lr=0.1)
    lr = torch.optim.lr_scheduler
    sched = lr.SequentialLR(opt, [lr.LinearLR(opt, 0.01, 1.0, total_iters=warmup),
                                  lr.CosineAnnealingLR(opt, T_max=1920 - warmup)], milestones=[warmup])
    plan = {"total_steps": 240, "sched_horizon": sched_horizon(sched), "sched_warmup": sched_warmup(sched)}
    assert plan["sched_horizon"] == 1920 and plan["sched_warmup"] == warmup
    rows = [{"kind": "step", "step": s, "lr": 1e-3, "sched_epoch": s - 1} for s in range(1, 10)]
    f = next(f for f in run_rules(rows, plan) if f.name == "schedule-horizon-mismatch")
    assert "decay never finish" in f.summary
    assert ("warmup (400 scheduler steps) and its decay never finish" in f.summary) == says_warmup, f.summary
    assert ("warmup ends at scheduler step 50" in f.summary) == (not says_warmup), f.summary


def test_nonfinite_rate_counts_the_steps_since_its_onset() -> None:
    # five healthy logged steps, then every logged loss NaN from step 60 on
    events = [{"kind": "step", "step": s, "t": float(s), "lr": 1e-3, "loss": 2.0} for s in (10, 20, 30, 40, 50)]
    events += [{"kind": "step", "step": s, "t": float(s), "lr": 1e-3, "loss": float("nan")} for s in (60, 70)]
    f = next(f for f in run_rules(events, {}) if f.name == "nonfinite-loss" and f.severity == "error")
    # the counts of the moment it is found, said with that step (the run may go on)
    assert "at 2 of the 7 steps seen by step 70 (28.6%, above 1%), every step since step 60" in f.summary, f.summary
    assert f.evidence["steps_since_onset"] == 2 and f.evidence["of_steps"] == 7


def _two_ranks(n: int, rank1: dict[int, dict] | None = None, both: dict[int, dict] | None = None):
    """n steps of two data-parallel ranks, interleaved as the store holds them (rank 1 a little behind);
    `rank1`/`both` override fields of rank 1's rows or of both ranks' rows at a step."""
    for s in range(1, n + 1):
        for rank in (0, 1):
            row = {"kind": "step", "step": s, "t": s + 0.01 * rank, "rank": rank, "loss": 2.0 - s / (2 * n),
                   "lr": 1e-3, "grad_norm": 1.0, "step_time": 0.05, "data_wait": 0.001}
            row.update((both or {}).get(s, {}))
            if rank == 1:
                row.update((rank1 or {}).get(s, {}))
            yield row


def test_every_rank_is_judged_and_a_problem_of_one_rank_is_attributed_to_it() -> None:
    # rank 1's loss goes NaN at step 40 while rank 0's stays finite: found, and said to be rank 1's
    found = run_rules(_two_ranks(100, rank1={40: {"loss": float("nan")}}), {"total_steps": 100})
    (f,) = [f for f in found if f.name == "nonfinite-loss"]
    assert f.step == 40 and f.summary.startswith("rank 1: ") and f.evidence["rank"] == 1
    # the same problem on every rank is the run's: one finding, spoken by rank 0, with no rank attached
    found = run_rules(_two_ranks(100, both={s: {"lr": 0.0} for s in range(30, 101)}), {"total_steps": 100})
    (f,) = [f for f in found if f.name == "lr-reaches-zero"]
    assert "rank" not in f.evidence and not f.summary.startswith("rank ")
    # rank 1 alone is held until rank 0 passes its step: fed rank 1 first, the finding waits for rank 0
    from trainguard.rules.engine import LEAD_GRACE

    engine = Engine({"total_steps": 100})
    rows = list(_two_ranks(100, rank1={40: {"loss": float("nan")}}))
    early = engine.feed_all([r for r in rows if r["rank"] == 1 and r["step"] <= 55])
    assert not [f for f in early if f.name == "nonfinite-loss"]
    # ...and a few steps more: rank 0 may be sure of the same problem a step or two later (a rate, a window)
    late = engine.feed_all([r for r in rows if r["rank"] == 0 and r["step"] <= 40 + LEAD_GRACE])
    assert [f.name for f in late if f.name == "nonfinite-loss"] == ["nonfinite-loss"]


def test_a_rule_that_raises_on_one_rank_is_switched_off_there_only() -> None:
    from trainguard.rules.schedule import LrReachesZero

    class _BreaksOnRankOne(Rule):
        code, name, severity = "TG998", "raises-on-rank-one", "warning"

        def on_step(self, row: dict) -> None:
            if row.get("rank") == 1:
                raise RuntimeError("boom")

    engine = Engine({"total_steps": 100}, rules=[_BreaksOnRankOne, LrReachesZero])
    engine.feed_all(_two_ranks(100, both={s: {"lr": 0.0} for s in range(30, 101)}))
    assert len(engine.errors) == 1 and "on rank 1" in engine.errors[0]
    assert [type(r) for r in engine.rules] == [_BreaksOnRankOne, LrReachesZero]


def test_a_node_without_rank_0_judges_its_ranks_without_waiting_for_it() -> None:
    # node 1 of a 2 x 2 job holds ranks 2 and 3 only: rank 3's NaN is found while the run goes on
    rows = [dict(r, rank=r["rank"] + 2) for r in _two_ranks(100, rank1={40: {"loss": float("nan")}})]
    engine = Engine({"total_steps": 100})
    live = engine.feed_all([r for r in rows if r["step"] <= 70])
    (f,) = [f for f in live if f.name == "nonfinite-loss"]
    assert f.summary.startswith("rank 3: ") and f.evidence["rank"] == 3


def test_data_wait_at_each_epochs_start_is_not_a_loop_waiting_for_data() -> None:
    """Workers spawned again at every 16-step epoch: one long wait, then batches ready. A loaded
    machine makes that one wait 0.3 s, more than the other 15 steps' 23 ms together (seen in CI under
    load: "51% of step time ... 24.7 ms of 48.0 ms a step"); a loader slower than the step on every step
    is what the rule is for."""
    def rows(wait_of: Callable[[int], float]) -> list[dict]:
        return [{"kind": "step", "step": s, "t": 0.05 * s, "loss": 1.0, "data_wait": wait_of(s),
                 "step_time": 0.023 + wait_of(s)} for s in range(1, 49)]
    epoch_starts = rows(lambda s: 0.3 if s % 16 == 1 else 0.0005)
    assert "data-wait-dominant" not in [f.name for f in run_rules(epoch_starts, {"total_steps": 48})]
    starved = rows(lambda s: 0.03)
    assert "data-wait-dominant" in [f.name for f in run_rules(starved, {"total_steps": 48})]


def test_a_short_noisy_run_whose_loss_went_down_a_little_is_not_called_not_learning() -> None:
    """60 steps of a small DDP regression: the loss fell 4.5% under step-to-step noise of 29% (its eval
    loss fell 28%). Too noisy to tell, and it went down: quiet. The same noise around a rising loss: said."""
    import math

    noise = [0.065 * math.sin(2.3 * s) for s in range(1, 61)]  # batch-to-batch, no drift of its own

    def rows(slope: float) -> list[dict]:
        return [{"kind": "step", "step": s, "t": float(s), "loss": 0.22 + slope * s + noise[s - 1]} for s in range(1, 61)]
    assert "loss-not-decreasing" not in [f.name for f in run_rules(rows(-0.0003), {"total_steps": 60})]
    assert "loss-not-decreasing" in [f.name for f in run_rules(rows(0.002), {"total_steps": 60})]
