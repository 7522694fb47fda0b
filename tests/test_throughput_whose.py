"""TG522 throughput-drop judged on the process's own time (issue 31, item 8).

A slowdown the process's CPU time does not share is not the run's work: at most an info note, `machine`
when other processes' load shows, `off-cpu` when nothing does. Rows are fed as the probe writes them
(`extra`: cpu_s, run_wait_s, proc_cpu_s, others_cores, runnable_per_core every 8th step, probe/schedclock.py).
"""

from __future__ import annotations

import time

import pytest

from trainguard.probe.schedclock import SchedClock
from trainguard.rules.process import ThroughputDrop

pytestmark = pytest.mark.unit


def _feed(slow_from: int, base_s: float, slow_s: float, clock_base: dict, clock_slow: dict, steps: int = 200):
    rule = ThroughputDrop({"total_steps": 1000})
    for step in range(1, steps + 1):
        slow = step >= slow_from
        extra = dict(clock_slow if slow else clock_base) if step % 8 == 0 else {}
        found = rule.on_step({"step": step, "step_time": slow_s if slow else base_s, "data_wait": 0.0,
                              "extra": extra})
        if found is not None:
            return found
    return None


def test_the_reported_false_alarm_wall_x33_cpu_x1_4_with_other_processes_loading_the_cores_is_an_info_note() -> None:
    f = _feed(100, 0.010, 0.330, {"proc_cpu_s": 0.009, "cpu_s": 0.008, "run_wait_s": 0.001, "others_cores": 0.1},
              {"proc_cpu_s": 0.0126, "cpu_s": 0.011, "run_wait_s": 0.02, "others_cores": 1.9})
    assert f is not None and f.severity == "info" and f.cause == "machine"
    assert "x1.4 against x33.0" in f.summary and "other processes kept 1.9 cores busy" in f.summary


def test_work_the_process_does_itself_is_a_warning_even_on_a_loaded_machine() -> None:
    f = _feed(100, 0.002, 0.130, {"proc_cpu_s": 0.0014, "run_wait_s": 0.0001, "others_cores": 0.2},
              {"proc_cpu_s": 0.0435, "run_wait_s": 0.08, "others_cores": 1.5})
    assert f is not None and f.severity == "warning" and "went from 1.4 to 43.5 ms" in f.summary


def test_contended_cores_stretching_the_cpu_time_x2_9_are_still_the_machine_when_its_load_shows() -> None:
    # torch's threads spin longer at their barriers on contended cores: the same work costs more CPU time
    f = _feed(100, 0.190, 0.650, {"proc_cpu_s": 0.058, "run_wait_s": 0.17}, {"proc_cpu_s": 0.166, "run_wait_s": 0.62})
    assert f is not None and f.severity == "info" and f.cause == "machine"


def test_a_slowdown_spent_waiting_with_no_load_to_blame_is_a_note_that_says_it_waits() -> None:
    f = _feed(100, 0.005, 0.055, {"proc_cpu_s": 0.004, "run_wait_s": 0.0, "others_cores": 0.1},
              {"proc_cpu_s": 0.0042, "run_wait_s": 0.0, "others_cores": 0.1})
    assert f is not None and f.severity == "info" and f.cause == "off-cpu" and "waits off the CPU" in f.summary


def test_cpu_that_doubled_with_no_load_is_the_runs_and_without_any_clock_it_stays_a_warning() -> None:
    f = _feed(100, 0.010, 0.040, {"proc_cpu_s": 0.009, "run_wait_s": 0.0}, {"proc_cpu_s": 0.022, "run_wait_s": 0.0})
    assert f is not None and f.severity == "warning"
    f = _feed(100, 0.010, 0.040, {}, {})
    assert f is not None and f.severity == "warning" and "CPU" not in f.summary


def test_a_machine_already_full_before_the_baseline_shows_its_load_in_the_queue_for_its_cores() -> None:
    # the CI case: two cores busy with other tests in the baseline already (others_cores cannot rise past
    # the cores), then two busy processes more; the run's CPU time a step x2.4 on the contended cores
    base = {"proc_cpu_s": 0.0696, "run_wait_s": 0.01, "others_cores": 1.8, "runnable_per_core": 1.5}
    slow = {"proc_cpu_s": 0.1679, "run_wait_s": 0.03, "others_cores": 1.9, "runnable_per_core": 2.5}
    f = _feed(100, 0.0538, 0.830, base, slow)
    assert f is not None and f.severity == "info" and f.cause == "machine"
    assert "2.5 tasks a core were runnable (1.5 in its baseline)" in f.summary
    # the same growth with the queue as it was: the run's own doubling, a warning
    f = _feed(100, 0.0538, 0.830, base, {**slow, "runnable_per_core": 1.5})
    assert f is not None and f.severity == "warning"


def test_spinning_threads_on_oversubscribed_cores_are_the_machine_and_real_work_stays_the_runs() -> None:
    # measured on a 2-core machine full before the baseline, two busy processes more: the process's CPU
    # time a step x5.3 (torch's threads spin at their barriers), the thread queued more than it ran
    base = {"proc_cpu_s": 0.0114, "cpu_s": 0.0057, "run_wait_s": 0.0117, "others_cores": 1.34,
            "runnable_per_core": 2.0}
    slow = {"proc_cpu_s": 0.0600, "cpu_s": 0.030, "run_wait_s": 0.097, "others_cores": 1.60,
            "runnable_per_core": 2.75}
    f = _feed(100, 0.0106, 0.118, base, slow)
    assert f is not None and f.severity == "info" and f.cause == "machine"
    # the same load, but the thread ran more than it queued: its own work
    f = _feed(100, 0.0106, 0.118, base, {**slow, "cpu_s": 0.100, "run_wait_s": 0.05})
    assert f is not None and f.severity == "warning"


def test_spinning_that_grew_the_cpu_time_x13_is_the_machine_where_it_spread_over_the_threads() -> None:
    # measured on a loaded 2-core machine (the zoo's quiet_throughput_cores_loaded beside three busy
    # processes): the process's CPU time a step x13, the training thread's own share of the extra 49%
    base = {"proc_cpu_s": 0.0046, "cpu_s": 0.0024, "run_wait_s": 0.0016, "others_cores": 0.95,
            "runnable_per_core": 2.5}
    slow = {"proc_cpu_s": 0.0612, "cpu_s": 0.0309, "run_wait_s": 0.083, "others_cores": 1.53,
            "runnable_per_core": 3.5}
    f = _feed(100, 0.0017, 0.114, base, slow)
    assert f is not None and f.severity == "info" and f.cause == "machine", f
    # the same growth all on the training thread (a decode fallen back to the main process) under the
    # same load: the run's own work, whatever the queue says
    f = _feed(100, 0.0017, 0.114, base, {**slow, "cpu_s": 0.0590})
    assert f is not None and f.severity == "warning"


def test_the_clock_reads_this_process_and_the_machine() -> None:
    clock = SchedClock()
    if clock.per_step(8) is None and clock._broken:
        pytest.skip("no schedstat here (not Linux)")
    end = time.thread_time() + 0.05
    while time.thread_time() < end:
        pass
    got = clock.per_step(16)
    clock.close()
    assert got is not None and got["proc_cpu_s"] >= 0.05 / 8 * 0.9 and got["cpu_s"] > 0
    assert "others_cores" not in got or got["others_cores"] >= 0
    assert "runnable_per_core" not in got or got["runnable_per_core"] > 0  # this thread is runnable itself


def test_the_cpu_time_of_an_evaluation_between_two_steps_is_not_counted_as_the_steps_own() -> None:
    # an evaluation every 20 steps costs 300 ms of CPU: the clock's sample that spans it is left out
    rule = ThroughputDrop({"total_steps": 1000})
    found = None
    for step in range(1, 201):
        slow = step >= 100
        extra = {}
        if step % 8 == 0:
            spans_eval = (step - 1) // 20 != (step - 9) // 20 and step > 20
            extra = {"proc_cpu_s": 0.005 + (0.3 / 8 if spans_eval else 0.0), "run_wait_s": 0.0,
                     "others_cores": 1.8 if slow else 0.1}
        found = found or rule.on_step({"step": step, "step_time": 0.060 if slow else 0.010, "extra": extra})
        if step % 20 == 0:
            rule.on_event({"kind": "eval", "step": step, "data": {"loss": 1.0}})
    assert found is not None and found.severity == "info" and found.cause == "machine"
