"""memory-creep over sample streams shaped like real runs, and the probe's memory sampling in a torch loop.

The rule is fed the events the probe writes ("sample" events with host RSS), through the same engine the
live run and `trainguard diagnose` use. Leaks must be found within issue 4's budget (5% of the plan or
200 steps after they start, whichever is smaller), early or late in a long run; healthy shapes that only
look like growth must stay quiet.

Run: pytest tests/test_memory_rules.py
"""

from __future__ import annotations

import random
from pathlib import Path

import torch

import trainguard
from trainguard.probe import samples
from trainguard.rules.engine import Engine
from trainguard.rules.memory import MemoryCreep, _Thinned
from trainguard.store.reader import RunReader

MIB = 2**20


def feed(total: int, rss_at, every: int = 3, phase_at=None) -> list:
    """Feeds one sample every `every` steps (RSS from `rss_at(step)`); returns the findings."""
    engine = Engine({"total_steps": total}, rules=[MemoryCreep])
    found = []
    for step in range(1, total + 1, every):
        data = {"rss": int(rss_at(step)), "phase": phase_at(step) if phase_at else "train"}
        found += engine.feed({"kind": "sample", "name": "memory", "step": step, "t": float(step), "data": data})
    return found + engine.end()


def budget(total: int) -> int:
    return min(200, int(0.05 * total))


def test_a_leak_from_the_start_is_found_within_budget_of_the_warmup() -> None:
    # the first 100 steps are warm-up (not judged): a leak from step 1 is timed from there
    found = feed(2000, lambda s: 350 * MIB + 2 * MIB * s)
    assert [f.name for f in found] == ["memory-creep"]
    assert found[0].evidence["judged_from"] == 100
    assert found[0].evidence["detected_step"] - 100 <= budget(2000)
    assert found[0].evidence["projected_growth_bytes"] > 3000 * MIB  # ~1,850 steps left at ~2 MiB a step


def test_a_leak_late_in_a_long_run_is_found_within_200_steps() -> None:
    # 90,000 flat steps (page-level noise) before a 4 MiB/step leak: the thinned history must not slow it.
    noise = random.Random(0)
    found = feed(100_000, lambda s: 400 * MIB + noise.randint(-64, 64) * 4096 + (4 * MIB * (s - 90_000) if s > 90_000 else 0),
                 every=20)
    assert [f.name for f in found] == ["memory-creep"]
    assert 90_000 <= found[0].evidence["detected_step"] <= 90_000 + 200


def test_a_bounded_cache_stays_quiet() -> None:
    assert feed(2000, lambda s: 350 * MIB + 2 * MIB * min(s, 8)) == []


def test_a_table_built_once_then_a_slow_drift_stays_quiet() -> None:
    # 120 MiB built at steps 10-14, then 32 KiB a step of metrics history: not a leak worth a warning
    table = lambda s: 120 * MIB * min(max(s - 10, 0), 4) / 4  # noqa: E731
    assert feed(2000, lambda s: 330 * MIB + table(s) + 32 * 1024 * s, every=2) == []


def test_evaluation_that_gathers_predictions_stays_quiet() -> None:
    # every 200 steps an eval of 40 steps gathers 4 MiB a step of predictions, then frees them
    def rss(s: int) -> float:
        into = s % 200
        return 400 * MIB + (4 * MIB * (into - 160) if into >= 160 else 0)

    assert feed(2000, rss, phase_at=lambda s: "eval" if s % 200 >= 160 else "train") == []


def gpu_warmup(s: int) -> float:
    """A healthy GPU process's host RSS: the CUDA context, then ~290 MiB of kernel modules loaded lazily
    over steps 10-100 in bursts (new kernels on their first launch), then level (the H200 distillation run
    that TG524 once warned on)."""
    bursts = sum(24 * MIB for at in range(10, 100, 8) if s >= at)
    return 1500 * MIB + bursts + (s % 7) * 64 * 1024


def test_a_gpu_warmup_that_levels_off_stays_quiet() -> None:
    assert feed(2000, gpu_warmup, every=2) == []
    assert feed(20_000, gpu_warmup, every=10) == []


def test_a_step_up_then_plateau_stays_quiet() -> None:
    # an unmarked first evaluation (or a cache filled once) late in the run: +300 MiB over 4 steps, then level
    def rss(s: int) -> float:
        return 800 * MIB + 300 * MIB * min(max(s - 600, 0), 4) / 4 + (s % 5) * 128 * 1024

    assert feed(2000, rss, every=2) == []


def test_a_step_up_in_the_later_half_of_a_slow_rise_stays_quiet() -> None:
    # 0.1 MiB a step for 60 steps and a 200 MiB step at its end: the quarters before it barely grew
    def rss(s: int) -> float:
        return 600 * MIB + 0.1 * MIB * min(max(s - 200, 0), 60) + (200 * MIB if s >= 255 else 0)

    assert feed(2000, rss, every=2) == []


def test_a_slow_linear_leak_is_found() -> None:
    # 0.5 MiB a step on a 1 GiB process from step 1,000 of 10,000: 4.4 GiB more by the end
    found = feed(10_000, lambda s: 1024 * MIB + 0.5 * MIB * max(s - 1000, 0), every=10)
    assert [f.name for f in found] == ["memory-creep"]
    assert 1000 <= found[0].evidence["detected_step"] <= 1000 + budget(10_000)
    assert found[0].evidence["bytes_per_step"] > 0.4 * MIB


def test_a_leak_without_a_plan_is_found() -> None:
    engine = Engine({}, rules=[MemoryCreep])
    found = []
    for step in range(1, 600, 3):
        data = {"rss": 400 * MIB + 2 * MIB * step, "phase": "train"}
        found += engine.feed({"kind": "sample", "name": "memory", "step": step, "t": float(step), "data": data})
    assert [f.name for f in found] == ["memory-creep"] and found[0].evidence["projected_growth_bytes"] is None


def test_noise_stays_quiet() -> None:
    # RSS that wanders by up to 48 MiB around its level, sample to sample, for a whole run
    noise = random.Random(1)
    assert feed(5000, lambda s: 2048 * MIB + noise.uniform(-48, 48) * MIB, every=5) == []


def test_a_leak_near_the_end_of_the_plan_is_not_projected_past_it() -> None:
    # 1 MiB a step in the last 150 steps of 2,000 on a 2 GiB process: it cannot run out before the end
    assert feed(2000, lambda s: 2048 * MIB + MIB * max(s - 1850, 0), every=2) == []


def test_the_first_evaluation_loads_its_kernels_then_a_later_leak_is_found() -> None:
    # the first eval (step 300) loads 250 MiB of its own kernels: not judged; a leak from step 600 is
    def rss(s: int) -> float:
        return 900 * MIB + (250 * MIB if s >= 300 else 0) + 3 * MIB * max(s - 600, 0)

    found = feed(2000, rss, every=2, phase_at=lambda s: "eval" if 300 <= s < 310 else "train")
    assert [f.name for f in found] == ["memory-creep"]
    assert 550 <= found[0].step and found[0].evidence["detected_step"] <= 600 + budget(2000)


def test_the_history_stays_bounded() -> None:
    series = _Thinned()
    for step in range(1_000_000):
        series.add(step, float(step))
    view = series.view()
    assert len(view) <= 128 + 32 and view[-1] == (999_999, 999_999.0) and view[0][0] < 20_000


def watched_linear(run_dir: Path, total: int):
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    guard = trainguard.watch(model, opt, total_steps=total, run_dir=run_dir)

    def train(steps: int) -> None:
        for _ in range(steps):
            loss = model(torch.randn(4, 8)).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            guard.step(loss)

    return guard, train


def test_the_probe_samples_memory_as_steps_complete(tmp_path: Path) -> None:
    guard, train = watched_linear(tmp_path, 400)
    train(400)
    guard.finish()
    with RunReader(tmp_path) as reader:
        got = [e for e in reader.events("sample")]
    steps = [e["step"] for e in got]
    # a fast loop: the 0.05 s gap limits them; each carries its step and the phase it was taken in
    assert got and all(e["data"]["rss"] > 0 and "phase" in e["data"] for e in got)
    assert steps == sorted(steps)


def test_a_failing_memory_sample_costs_no_step_row(tmp_path: Path, monkeypatch) -> None:
    def broken(*a, **k):
        raise OSError("no /proc here")

    monkeypatch.setattr(samples, "memory_sample", broken)  # a fault in what the probe reads, not in the probe
    guard, train = watched_linear(tmp_path, 100)
    train(100)
    guard.finish()
    with RunReader(tmp_path) as reader:
        assert reader.step_count() == 100 and reader.events("sample") == []
    log = (tmp_path / "guard.log").read_text()
    assert "memory samples (switched off)" in log and "switched itself off" not in log


def test_rules_that_break_stop_feeding_their_inbox(tmp_path: Path) -> None:
    guard, train = watched_linear(tmp_path, 100)

    def broken(batch):
        raise RuntimeError("a rules pass that raises")

    rules = guard.probe._ending.rules  # the probe's own rules (probe/alone.py): a script running alone
    rules.inbox.engine.feed_all = broken  # a fault inside the rules, to see what the probe does with it
    rules.run()
    assert rules.inbox is None and guard.writer.tap is None
    train(20)
    guard.finish()
    with RunReader(tmp_path) as reader:
        assert reader.step_count() == 20
