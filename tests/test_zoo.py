"""The scenario zoo as tests: every scenario must end as its expect.yaml says (real processes, real torch).

Run one: pytest tests/test_zoo.py -k seed001
The same scenarios print their table with: python scenarios/zoo.py
"""

from __future__ import annotations

import json
import os

import pytest
import zoo


@pytest.mark.parametrize("name", zoo.scenario_names())
def test_scenario(name: str) -> None:
    result = zoo.run_scenario(name)
    record = os.environ.get("TRAINGUARD_ZOO_RESULTS")
    if record:  # one JSON line per scenario, for the zoo's table: python scenarios/zoo.py --table FILE
        with open(record, "a") as fh:
            fh.write(json.dumps({"name": name, "expected": result.expected, "got": result.got,
                                 "detect": result.detect, "seconds": round(result.seconds, 1),
                                 "ok": result.ok, "skipped": result.skipped}) + "\n")
    if result.skipped:
        pytest.skip(result.got)
    assert result.ok, f"{name}: {'; '.join(result.problems)}\n--- output tail ---\n{result.output}"


def test_zoo_is_not_empty() -> None:
    # pytest's exit 5 (no tests) must never pass as green: the zoo is the heart of the suite
    assert len(zoo.scenario_names()) >= 8
