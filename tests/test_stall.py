"""The stall policy learns from the run itself: startup is generous, the first gap is not learned from."""

from __future__ import annotations

from trainguard.watchdog.stall import StallPolicy


def test_startup_keeps_the_startup_timeout_until_the_first_step() -> None:
    policy = StallPolicy()
    policy.observe(100.0, "train", startup=True)  # probe started, a phase began, no step yet
    assert policy.timeout("train", startup=True) == policy.startup_timeout
    # 75 s after the probe started (a compile, a first batch): not a hang
    assert policy.stalled(175.0, 100.0, 0.0, "train", startup=True) is None


def test_the_first_gap_is_not_learned_from_but_later_ones_are() -> None:
    policy = StallPolicy()
    for t in (0.0, 120.0, 120.5, 121.0, 121.5):  # the first step took 2 minutes (compilation), then 0.5 s
        policy.observe(t, "train")
    assert policy.timeout("train") == policy.min_timeout  # 10 x 0.5 s is below the 60 s floor
    policy.observe(200.0, "train")  # an 78.5 s gap later in the run is learned
    assert policy.timeout("train") == 785.0


def test_a_fixed_timeout_holds_once_the_probe_started() -> None:
    policy = StallPolicy(fixed=4.0)
    assert policy.timeout(None) == 60.0  # before any mark: imports get a floor
    assert policy.timeout(None, startup=True) == 4.0  # the probe started: the user's number
