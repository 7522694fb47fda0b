"""`trainguard diagnose` on a folder of several runs and on a YOLO folder it must refuse, as a user runs it:
one section per run (worst first) and its exit code, the JSON listing each run, a refusal in one line.

Run: pytest -p no:xdist tests/test_diagnose_folders_cli.py
"""

from __future__ import annotations

import json
import math
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
