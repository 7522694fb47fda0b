"""`trainguard diagnose` on a folder of several runs and on a YOLO folder it must refuse, as a user runs it:
one section per run (worst first) and its exit code, the JSON listing each run, a refusal in one line.

Run: pytest -p no:xdist tests/test_diagnose_folders_cli.py
"""

from __future__ import annotations

import json
import math
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
