"""TG521 log-flood: many lines a step that also scroll faster than anyone reads (rules/process.py).

A flood's harm is a terminal nobody can read and a log that buries its one useful line. Lines a step
alone do not show it: a reinforcement-learning loop of minutes a step printing its samples and timings
(30 lines at 277 s a step) scrolls a line every ten seconds.
"""

from __future__ import annotations

import pytest

from trainguard.rules.process import LogFlood

pytestmark = pytest.mark.unit


def _feed(rule: LogFlood, per_step: int, seconds_per_step: float | None, steps: int = 60) -> list:
    found = []
    for step in range(0, steps + 1, 2):  # the watchdog counts lines at its polls, not at every step
        t = None if seconds_per_step is None else 1000.0 + step * seconds_per_step
        f = rule.on_event({"kind": "output", "step": step, "t": t, "data": {"lines": step * per_step}})
        if f:
            found.append(f)
    return found


def test_twenty_lines_a_step_at_twenty_steps_a_second_is_a_flood() -> None:
    found = _feed(LogFlood({"total_steps": 1000}), per_step=20, seconds_per_step=0.05)
    assert found and found[0].evidence["lines_per_second"] == pytest.approx(400.0)
    assert "400 a second" in found[0].summary


def test_a_thirty_line_report_on_steps_of_minutes_is_no_flood() -> None:
    assert _feed(LogFlood({"total_steps": 110}), per_step=30, seconds_per_step=277.0) == []


def test_the_same_report_printed_at_a_step_a_second_is_one() -> None:
    assert _feed(LogFlood({"total_steps": 110}), per_step=30, seconds_per_step=1.0)


def test_offline_without_times_the_volume_decides() -> None:
    # a log read offline gives one count at its start and one at its end (ingest/textlog.py, rules/live.py):
    # 12,000 lines over a run (a log anyone can page through) against 150,000 (seed 004 printed 896,000)
    def offline(steps: int, per_step: int) -> list:
        rule = LogFlood({})
        rule.on_event({"kind": "output", "step": 0, "t": None, "data": {"lines": 0}})
        return [f for f in [rule.on_event({"kind": "output", "step": steps, "t": None,
                                           "data": {"lines": steps * per_step}})] if f]

    assert offline(400, 30) == []
    assert offline(5000, 30)
