"""The fuzzers in CI, on a fixed budget: every reader and `trainguard check` meet damaged and hostile input.

`tests/fuzzing.py` generates the cases (seeded: the same cases every run) and runs the real CLI command
on each. A case fails on a traceback, exit 70, a hang past its time limit, or a raw control character
in what was printed. The full campaign (5,000 cases per target) runs by hand:
`python tests/fuzzing.py --cases 5000`.
"""

from __future__ import annotations

import os

import fuzzing
import pytest

CASES = int(os.environ.get("TRAINGUARD_FUZZ_CASES", "60"))  # per target, in CI


@pytest.mark.parametrize("target", sorted(fuzzing.TARGETS))
def test_no_reader_breaks_on_damaged_or_hostile_input(target: str) -> None:
    tally = fuzzing.fuzz([target], CASES, seed=7)[target]
    assert tally.cases == CASES
    assert tally.ok(), "\n".join(tally.failures[:10])
