"""The probe's background thread paces its work (probe/pacing.py): every item, in order, with pauses
between stretches of work, and none once the run is ending."""

from __future__ import annotations

import gc
import threading
import time

from trainguard.probe import pacing


def _busy(seconds: float) -> None:
    """Work for `seconds` of the thread's CPU time and of wall time both: pacing pauses by the wall clock
    and counts stretches in CPU time, and a loaded machine (CI's other worker) makes the two differ."""
    wall, cpu = time.perf_counter() + seconds, time.thread_time() + seconds
    while time.perf_counter() < wall or time.thread_time() < cpu:
        pass


def _wait(seconds: float) -> None:
    """Let `seconds` of wall time pass (time.sleep is patched out in these tests)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_paced_yields_every_item_in_order_and_pauses_between_stretches() -> None:
    items = list(range(12))
    seen = []
    pacing.begin_pass()
    t0 = time.perf_counter()
    for item in pacing.paced(items):
        _busy(2 * pacing.CHUNK_S)  # each item is longer than a stretch: a pause after each
        seen.append(item)
    wall = time.perf_counter() - t0
    assert seen == items
    # the work itself plus at least the pauses after the first eleven items
    assert wall >= 12 * 2 * pacing.CHUNK_S + 11 * pacing.PAUSE_S


def test_paced_never_pauses_when_disabled_or_once_stop_is_set(monkeypatch) -> None:
    pauses: list[float] = []
    monkeypatch.setattr(pacing.time, "sleep", pauses.append)
    stop = threading.Event()
    pacing.begin_pass()
    for _ in pacing.paced(range(5), stop=stop):
        _busy(2 * pacing.CHUNK_S)
    assert len(pauses) == 5
    stop.set()
    for _ in pacing.paced(range(5), stop=stop):
        _busy(2 * pacing.CHUNK_S)
    for _ in pacing.paced(range(5), enabled=False):
        _busy(2 * pacing.CHUNK_S)
    assert len(pauses) == 5


def test_the_budget_runs_across_the_parts_of_a_pass_and_its_stretches_are_counted(monkeypatch) -> None:
    # A pass is several parts in a row: work done before a paced loop counts toward its first pause, and
    # the stretch ends in STRETCHES (the benchmark's figure of the longest hold of the interpreter lock).
    pauses: list[float] = []
    monkeypatch.setattr(pacing.time, "sleep", pauses.append)
    monkeypatch.setattr(pacing, "STRETCHES", pacing.Stretches())
    pacing.begin_pass()
    _busy(4 * pacing.CHUNK_S)  # one part, not paced itself
    pacing.breathe()
    assert len(pauses) == 1
    assert pacing.STRETCHES.count == 1 and pacing.STRETCHES.longest >= 3 * pacing.CHUNK_S
    for _ in pacing.paced(range(3)):
        pass  # short items: no pause
    assert len(pauses) == 1
    pacing.resting()
    assert pacing.STRETCHES.count == 2
    pacing.resting()  # nothing began since: nothing counted
    assert pacing.STRETCHES.count == 2


def test_a_pass_pauses_only_in_its_window_so_the_thread_never_falls_behind(monkeypatch) -> None:
    # Paced, the thread does at most a third of a core's work: a pass with more than its window's worth
    # finishes the rest in one go (rows committed and judged on time), and the next pass's window opens anew.
    pauses: list[float] = []
    monkeypatch.setattr(pacing.time, "sleep", pauses.append)  # (the pause itself then takes no time)
    # a window far longer than the first ten items take, even on a loaded machine
    monkeypatch.setattr(pacing, "PACE_WINDOW_S", 0.3)
    pacing.begin_pass()
    for _ in pacing.paced(range(10)):
        _busy(2 * pacing.CHUNK_S)
    assert len(pauses) == 10
    _wait(0.3)  # the window is over
    for _ in pacing.paced(range(10)):
        _busy(2 * pacing.CHUNK_S)
    assert len(pauses) == 10
    assert pacing.pass_elapsed() >= 0.3
    pacing.begin_pass()
    for _ in pacing.paced(range(3)):
        _busy(2 * pacing.CHUNK_S)
    assert len(pauses) == 13


def test_a_pass_over_a_real_loops_steps_is_cut_into_short_stretches(tmp_path, monkeypatch) -> None:
    # A real guard on a real CPU loop: 800 steps left for one background pass (a fast loop's half second).
    # Resolving their values, building and storing the rows and committing them is tens of ms of Python;
    # paced, it is many short stretches (thread CPU, so a loaded machine does not inflate them).
    import torch

    import trainguard
    from trainguard.probe import drain

    monkeypatch.setattr(drain, "FLUSH_INTERVAL", 3600.0)  # the guard's own thread stays out of the way
    monkeypatch.setattr(pacing, "STRETCHES", pacing.Stretches())
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    guard = trainguard.watch(model, opt, total_steps=1000, run_dir=tmp_path)
    x = torch.randn(4, 8)

    def train(steps: int) -> None:
        for _ in range(steps):
            out = model(x)
            nll, smooth = out.pow(2).mean(), out.abs().mean()
            loss = 0.9 * nll + 0.1 * smooth
            loss.backward()
            guard.step(loss, parts={"nll": nll, "smooth": smooth}, weights={"nll": 0.9, "smooth": 0.1})
            opt.step()
            opt.zero_grad()

    try:
        # A first pass, not measured: what runs once (the store's schema, the rules' first look) is not a
        # pass's steady work. And no garbage collection inside the measured pass: a full collection of a
        # test worker's heap, hundreds of tests in, is one stretch of its own wherever it lands (194 ms of
        # a 208 ms pass in one CI run; this pass is 15 ms alone), and any thread's allocation can start it.
        train(20)
        guard.probe.drain()
        guard.writer.flush()
        monkeypatch.setattr(pacing, "STRETCHES", pacing.Stretches())
        train(800)
        gc.collect()
        gc.disable()
        try:
            cpu0 = time.thread_time()
            pacing.begin_pass()
            guard.probe.drain()
            pacing.breathe()
            guard.writer.flush(pause=pacing.breathe)
            pacing.resting()
            cpu = time.thread_time() - cpu0
        finally:
            gc.enable()
        stretches = pacing.STRETCHES
        # (a ratio, so a slower machine does not matter: ~1/20 here; ~1/5 with the values read in one go)
        assert stretches.count >= 8
        assert stretches.longest < cpu / 10, f"longest stretch {1000 * stretches.longest:.2f} ms of {1000 * cpu:.1f} ms"
    finally:
        guard.finish()
    import sqlite3

    with sqlite3.connect(tmp_path / "run.db") as db:
        assert db.execute("select count(*) from steps").fetchone()[0] == 820
