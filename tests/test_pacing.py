"""The probe's background thread paces its work (probe/pacing.py): every item, in order, with pauses
between stretches of work, and none once the run is ending."""

from __future__ import annotations

import threading
import time

from trainguard.probe import pacing


def _busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_paced_yields_every_item_in_order_and_pauses_between_stretches() -> None:
    items = list(range(12))
    seen = []
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
    pacing.rested()
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
