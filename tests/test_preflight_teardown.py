"""Preflight's resumed start: an abort at the process's teardown after every rank made its steps is no
failed resume (a 2-rank gloo job aborts at exit about 1 run in 10, pytorch/pytorch#190489; the round trip
had worked); a crash before the stop, or another error beside the abort, still is (TG602)."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainguard.findings import Finding
from trainguard.preflight import judge
from trainguard.rules.crash import RUN_CRASHED, TEARDOWN_EXPLAINED

pytestmark = pytest.mark.unit


def _start(tmp_path: Path, name: str, *, state: str, findings: list[Finding], stopped: bool) -> dict:
    d = tmp_path / name
    d.mkdir()
    return {"probe": "watch", "opt_steps": 2, "dir": d, "mode": name, "exit_code": 1 if findings else 0,
            "state": state, "findings": findings, "events": [], "other_phase_steps": [],
            "checkpoints": [{"path": "/x/epoch0.pt"}], "step_times": [], "plan": {}, "crash_event_id": None,
            "ranks": {r: {"forced": [], "stopped_at": 7 if stopped else None} for r in ("0", "1")}}


def _abort(summary: str) -> Finding:
    return Finding.of(RUN_CRASHED, step=3, summary=summary, evidence={}, fix="", source="watchdog")


def _names(tmp_path: Path, resume: dict) -> list[str]:
    first = _start(tmp_path, "first", state="passed", findings=[], stopped=True)
    return [f.name for f in judge.judge(first, resume, None, [], origin=str(tmp_path))]


def test_an_abort_at_teardown_after_every_rank_stopped_is_no_failed_resume(tmp_path: Path) -> None:
    resume = _start(tmp_path, "resume", state="crashed", stopped=True,
                    findings=[_abort(f"rank 0 failed first: abort: {TEARDOWN_EXPLAINED}")])
    assert "checkpoint-resume-failed" not in _names(tmp_path, resume)


def test_the_same_abort_before_the_ranks_made_their_steps_is_one(tmp_path: Path) -> None:
    resume = _start(tmp_path, "resume", state="crashed", stopped=False,
                    findings=[_abort(f"rank 0 failed first: abort: {TEARDOWN_EXPLAINED}")])
    assert "checkpoint-resume-failed" in _names(tmp_path, resume)


def test_a_load_error_is_one_whatever_the_stops_say(tmp_path: Path) -> None:
    resume = _start(tmp_path, "resume", state="crashed", stopped=True,
                    findings=[_abort("RuntimeError: Error(s) in loading state_dict for Net")])
    assert "checkpoint-resume-failed" in _names(tmp_path, resume)
