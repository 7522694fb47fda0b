"""`trainguard diagnose` on a folder of several runs and on a YOLO folder it must refuse, as a user runs it:
one section per run (worst first) and its exit code, the JSON listing each run, a refusal in one line.

Run: pytest -p no:xdist tests/test_diagnose_folders_cli.py
"""

from __future__ import annotations

import json
import math
import shutil
import sys
from pathlib import Path

import pytest
from test_diagnose_folders import falling, tb_run, ultralytics_run
from tgtest import run_trainguard

pytestmark = pytest.mark.process


def test_a_folder_of_runs_prints_a_section_per_run_worst_first(tmp_path: Path) -> None:
    tb_run(tmp_path / "runs" / "exp1", falling(200))
    bad = falling(200)
    bad[120:] = [math.nan] * 80
    tb_run(tmp_path / "runs" / "exp2", bad)
    text = run_trainguard("diagnose", str(tmp_path / "runs"))
    assert text.returncode == 1, text.stderr
    out = text.stdout
    assert out.startswith(f"{tmp_path / 'runs'}: 2 runs") and out.index("exp2") < out.index("exp1/")
    assert out.count("TG301") == 1  # the warning and its escalation: one finding
    doc = json.loads(run_trainguard("diagnose", str(tmp_path / "runs"), "--json").stdout)
    assert doc["format"] == "several runs" and [Path(r["path"]).parent.name for r in doc["runs"]] == ["exp2", "exp1"]
    # one run of them, alone: as before
    alone = run_trainguard("diagnose", str(tmp_path / "runs" / "exp1"), "--json")
    assert alone.returncode == 0 and json.loads(alone.stdout)["format"] == "tensorboard event files"


def test_a_folder_holding_one_run_reads_that_run_and_never_a_linked_one(tmp_path: Path) -> None:
    # `runs/detect/` after the first training: one run below it; a link planted beside it (to a run elsewhere)
    # is not followed, nor a scheduler file that links out of the run folder
    ultralytics_run(tmp_path / "runs" / "detect" / "train", 20, 20)
    elsewhere = ultralytics_run(tmp_path / "elsewhere", 20, 5)
    (tmp_path / "elsewhere" / "slurm-1.out").write_text(
        "slurmstepd: error: *** JOB 1 ON n1 CANCELLED AT 2026-01-01T00:00:00 DUE TO TIME LIMIT ***\n")
    (tmp_path / "runs" / "detect" / "linked").symlink_to(elsewhere)
    (tmp_path / "runs" / "detect" / "train" / "slurm-2.out").symlink_to(tmp_path / "elsewhere" / "slurm-1.out")
    doc = json.loads(run_trainguard("diagnose", str(tmp_path / "runs" / "detect"), "--json").stdout)
    assert doc["format"] == "ultralytics results.csv" and doc["state"] == "completed", doc
    assert Path(doc["path"]).parent.name == "train" and not doc["findings"]
    # with the one run gone, the folder holds nothing it reads: refused in one line, the link not followed
    shutil.rmtree(tmp_path / "runs" / "detect" / "train")
    refused = run_trainguard("diagnose", str(tmp_path / "runs" / "detect"))
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr


def test_a_yolo_folder_whose_table_is_gone_is_refused_in_one_line(tmp_path: Path) -> None:
    run = ultralytics_run(tmp_path / "train", 100, 0)
    (run / "weights" / "last.pt").write_bytes(b"PK")
    proc = run_trainguard("diagnose", str(run))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    (run / "weights" / "last.pt").unlink()
    proc = run_trainguard("diagnose", str(run), "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout)["state"] == "unfinished"


NAN_RUN = """
import torch, trainguard
m = torch.nn.Linear(4, 1); o = torch.optim.SGD(m.parameters(), lr=0.05)
g = trainguard.watch(m, o, total_steps=120)
for i in range(120):
    loss = m(torch.randn(8, 4)).pow(2).mean()
    loss.backward(); o.step(); o.zero_grad()
    g.step(loss * float("nan") if i >= 60 else loss)
g.finish()
"""


def test_a_run_folders_escalated_finding_is_one_in_its_json(tmp_path: Path) -> None:
    # TG301 warns at the first non-finite loss and escalates to an error past its rate: one finding
    (tmp_path / "train.py").write_text(NAN_RUN)
    run_dir = tmp_path / "run"
    run_trainguard("run", "--run-dir", str(run_dir), "--", sys.executable, "train.py", cwd=tmp_path)
    found = json.loads(run_trainguard("diagnose", "--json", str(run_dir)).stdout)
    tg301 = [f for f in found if f["code"] == "TG301"]
    assert len(tg301) == 1 and tg301[0]["severity"] == "error", tg301


def test_a_folder_none_of_whose_runs_can_be_read_is_refused_and_the_rules_not_run_are_one_line(tmp_path: Path) -> None:
    # two Lightning versions whose event files hold no scalar a reader knows: refused as one such run is
    for v in (0, 1):
        tb_run(tmp_path / "lightning_logs" / f"version_{v}", [0.5], tag="hp_metric")
    refused = run_trainguard("diagnose", str(tmp_path))
    assert refused.returncode == 2 and "none of its 2 runs could be read" in refused.stderr, refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    # one readable run: the rules that had no data are counted in one line, listed with --verbose
    tb_run(tmp_path / "ok", falling(120))
    short = run_trainguard("diagnose", str(tmp_path / "ok"))
    assert "rules need data this source does not hold: --verbose lists them" in short.stdout
    assert "no update_ratio" not in short.stdout
    assert "no update_ratio" in run_trainguard("diagnose", "--verbose", str(tmp_path / "ok")).stdout
