"""The restart policy (`--on-hang restart`), alone and end to end.

    pytest tests/test_hang_restart.py

Alone: which hang restarts, which stops (same cause and place = the failure repeats, TG507), and which
checkpoint a restart resumes from. End to end: a real script under `trainguard run` that reports a
checkpoint and then hangs; the restarted attempt must get TRAINGUARD_RESUME_FROM and TRAINGUARD_ATTEMPT,
and the second identical hang must stop the restarts.
"""

from __future__ import annotations

import json
import sqlite3
import textwrap
from pathlib import Path

import pytest
from tgtest import run_trainguard

from trainguard.errors import UserError
from trainguard.findings import Finding
from trainguard.watchdog.restart import RestartPolicy, newest_checkpoint


def _hang(cause: str, where: str | None, step: int = 30) -> Finding:
    return Finding(code="TG502", name="run-hung", severity="error", summary="no progress", step=step,
                   cause=cause, where=where, fix="fix it")


def test_first_hang_restarts_from_the_checkpoint_and_the_same_hang_again_stops() -> None:
    policy = RestartPolicy("restart", max_restarts=3)
    first = policy.after_hang(_hang("deadlock", "train.py:31 (<module>)"), "/ck/20.pt")
    assert first.restart and first.resume_from == "/ck/20.pt"
    again = policy.after_hang(_hang("deadlock", "train.py:31 (<module>)", step=31), "/ck/20.pt")
    assert not again.restart
    assert again.finding is not None and again.finding.code == "TG507" and again.finding.name == "hang-repeats"
    assert "repeats" in again.finding.summary and again.finding.where == "train.py:31 (<module>)"


def test_a_hang_somewhere_else_restarts_until_max_restarts() -> None:
    policy = RestartPolicy("restart", max_restarts=2)
    assert policy.after_hang(_hang("io", "a.py:1 (f)"), None).restart
    assert policy.after_hang(_hang("io", "a.py:2 (f)"), None).restart
    last = policy.after_hang(_hang("io", "a.py:3 (f)"), None)
    assert not last.restart and last.finding is None and "--max-restarts 2" in last.note


def test_unknown_places_never_count_as_a_repeat_and_kill_never_restarts() -> None:
    policy = RestartPolicy("restart", max_restarts=5)
    policy.after_hang(_hang("unknown", None), None)
    assert policy.after_hang(_hang("unknown", None), None).restart
    assert not RestartPolicy("kill").after_hang(_hang("io", "a.py:1 (f)"), "/x").restart
    with pytest.raises(UserError):
        RestartPolicy("restart", max_restarts=-1)


def test_newest_existing_checkpoint_wins(tmp_path: Path) -> None:
    old, new = tmp_path / "a.pt", tmp_path / "b.pt"
    old.write_bytes(b"1")
    events = [{"name": str(old), "data": {"path": str(old)}}, {"name": str(new), "data": {"path": str(new)}}]
    assert newest_checkpoint(events) == str(old)  # b.pt was reported but is gone
    new.write_bytes(b"2")
    assert newest_checkpoint(events) == str(new)
    assert newest_checkpoint([]) is None


SCRIPT = textwrap.dedent('''
    import json, os, threading, time
    import trainguard

    guard = trainguard.watch()
    attempt = int(os.environ.get("TRAINGUARD_ATTEMPT", "-1"))
    with open("attempts.jsonl", "a") as fh:
        fh.write(json.dumps({"attempt": attempt, "resume_from": guard.resume_from}) + "\\n")
    for step in range(1, 6):
        guard.step(1.0)
        time.sleep(0.05)
    if guard.resume_from is None:
        open("ckpt.txt", "w").write("step 5")
        guard.checkpoint_saved("ckpt.txt")
    threading.Event().wait()  # PLANTED
''')


def test_restart_resumes_from_the_reported_checkpoint_and_stops_when_the_hang_repeats(workdir: Path) -> None:
    (workdir / "train.py").write_text(SCRIPT)
    import sys

    r = run_trainguard("run", "--quiet", "--run-dir", "run", "--stall-timeout", "3", "--on-hang", "restart",
                       "--max-restarts", "3", "--", sys.executable, "train.py", cwd=workdir, timeout=150)
    assert r.returncode == 124, r.stderr
    attempts = [json.loads(line) for line in (workdir / "attempts.jsonl").read_text().splitlines()]
    assert [a["attempt"] for a in attempts] == [0, 1]  # stopped after the repeat, not at --max-restarts
    assert attempts[0]["resume_from"] is None
    assert attempts[1]["resume_from"] == str((workdir / "ckpt.txt").resolve())
    status = json.loads((workdir / "run" / "status.json").read_text())
    assert status["state"] == "hung" and status["attempt"] == 1
    names = [f["name"] for f in status["findings"]]
    assert names.count("run-hung") == 2 and "hang-repeats" in names
    line = next(i for i, t in enumerate(SCRIPT.splitlines(), 1) if "PLANTED" in t)
    repeat = next(f for f in status["findings"] if f["name"] == "hang-repeats")
    assert repeat["cause"] == "deadlock" and repeat["where"].endswith(f"train.py:{line} (<module>)")
    with sqlite3.connect(workdir / "run" / "run.db") as db:
        restarts = db.execute("SELECT data FROM events WHERE kind='run' AND name='restart'").fetchall()
    assert len(restarts) == 1 and json.loads(restarts[0][0])["resume_from"] == attempts[1]["resume_from"]
    assert (workdir / "run" / "stacks" / "hang-0.txt").exists() and (workdir / "run" / "stacks" / "hang-1.txt").exists()
