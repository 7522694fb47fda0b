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


def test_found_within_fails_a_stall_found_later_than_its_timeout_plus_the_budget() -> None:
    # the check behind the quiet set's "found within the stall timeout + 15 s" must be able to fail
    def status(after: float) -> dict:
        ev = {"stall_timeout": 60.0, "last_progress_at": 1000.0, "detected_at": 1000.0 + after}
        return {"state": "hung", "findings": [{"name": "run-stalled", "severity": "warning", "evidence": ev}]}

    exp = {"state": "hung", "findings": ["run-stalled"], "found_within": 15}
    assert zoo.judge("twin", exp, 124, status(74.0), 80.0, "").ok
    late = zoo.judge("twin", exp, 124, status(76.0), 80.0, "")
    assert not late.ok and "found 76.0 s after the last progress" in late.problems[0]


def test_a_backends_block_replaces_only_the_expectations_it_names_and_only_those_may_be_replaced(tmp_path,
                                                                                               monkeypatch) -> None:
    # over NCCL the crash is a device-side assert: written down in its `nccl:` block, the rest unchanged
    crash = zoo.expectations("torchrun_ddp_crash", "nccl")
    assert crash["cause"] == "cuda-device-assert" and crash["rank"] == 1 and "nccl" not in crash
    assert "cause" not in zoo.expectations("torchrun_ddp_crash") and "nccl" not in zoo.expectations("torchrun_ddp_crash")
    assert "torchrun_ddp_healthy" in zoo.backend_names("nccl") and "seed001_eval_typeerror" not in zoo.backend_names("nccl")
    with pytest.raises(ValueError, match="does not run over nccl"):
        zoo.expectations("seed001_eval_typeerror", "nccl")
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "expect.yaml").write_text("state: completed\nnccl: {summary: looser}\n")
    monkeypatch.setattr(zoo, "HERE", tmp_path)
    with pytest.raises(ValueError, match="not summary"):
        zoo.expectations("odd", "nccl")
