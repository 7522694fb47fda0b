"""`trainguard demo`, the Quick start's first command: a healthy run stays quiet, two seeds' failures are
caught with their evidence and fix, and the demo ends saying where each report is.

    .venv/bin/python -m pytest -q -n 0 tests/test_demo.py
"""

from __future__ import annotations

import json
from pathlib import Path

from tgtest import run_trainguard


def test_demo_shows_two_failures_caught_and_a_quiet_healthy_run(workdir: Path) -> None:
    out = run_trainguard("demo", "--root", "runs", cwd=workdir, timeout=240)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    runs = sorted(p for p in (workdir / "runs").iterdir() if (p / "status.json").is_file())
    status = {p.name.split("-demo-")[1]: json.loads((p / "status.json").read_text()) for p in runs}
    assert status["train_tiny"]["state"] == "completed" and status["train_tiny"]["findings"] == []
    lr = {f["name"]: f for f in status["lr_per_microbatch"]["findings"]}
    assert lr["lr-reaches-zero"]["step"] == 8 and lr["lr-reaches-zero"]["evidence"]["lr"] == 0
    assert status["lr_per_microbatch"]["step"] < 120  # stopped on the finding, not trained to the end
    hang = next(f for f in status["stuck_worker"]["findings"] if f["name"] == "run-hung")
    assert hang["cause"] == "dataloader-worker" and hang["where"].endswith("stuck_worker.py:28 (__getitem__)")
    # the evidence, the fix and the worker's own frame are on the terminal, not only in the run folder
    assert "evidence of TG101 lr-reaches-zero:" in text and "onset_step: 8" in text
    assert "fix: size the scheduler in optimizer steps" in text
    assert "stuck_worker.py:28 in __getitem__" in text
    # each finding once, and the demo ends with where the reports are
    assert text.count("trainguard: TG101 lr-reaches-zero") == 1
    tail = out.stdout[out.stdout.rindex("== done in"):]
    for p in runs:
        assert f"report: runs/{p.name}/report.html" in tail and (p / "report.html").is_file()
