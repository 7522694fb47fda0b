"""`trainguard preflight` on a script without `trainguard.watch`: it never harms, never claims what it did
not check. Real preflight, real torch, real files.

    pytest -q -n 0 tests/test_preflight_noprobe.py
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import zoo
from tgtest import run_trainguard

OLD_CKPT = b"a checkpoint of an earlier real run: these bytes must survive the preflight\n"
OLD_RESULTS = b'{"best": 0.91}\n'


def test_pre_existing_files_keep_their_bytes_and_the_verdict_is_never_passed(tmp_path: Path) -> None:
    work = tmp_path / "project"
    shutil.copytree(zoo.HERE / "preflight_noprobe_keeps_files", work)
    script = (work / "train.py").read_text()
    # besides the checkpoint saved every 5 steps (anchored at the script's real folder), the script
    # opens a results file of its own there for appending, from its first line: refused too
    script = script.replace('CKPT = Path(__file__).resolve().parent / "checkpoints" / "last.pt"',
                            'CKPT = Path(__file__).resolve().parent / "checkpoints" / "last.pt"\n'
                            'try:\n'
                            '    open(Path(__file__).resolve().parent / "results.json", "a").write("{}")\n'
                            'except PermissionError as exc:\n'
                            '    print(f"refused: {exc}", flush=True)')
    (work / "train.py").write_text(script)
    (work / "checkpoints" / "last.pt").write_bytes(OLD_CKPT)
    (work / "results.json").write_bytes(OLD_RESULTS)
    stats = {p: os.stat(work / p) for p in ("checkpoints/last.pt", "results.json")}

    r = run_trainguard("preflight", "--run-dir", str(work / "run"), "--", sys.executable, "train.py", cwd=work,
                       timeout=150)

    assert r.returncode == 3, r.stderr[-3000:]  # could not check everything: never 0
    assert (work / "checkpoints" / "last.pt").read_bytes() == OLD_CKPT
    assert (work / "results.json").read_bytes() == OLD_RESULTS
    for p, st in stats.items():
        assert os.stat(work / p).st_mtime_ns == st.st_mtime_ns, p
    status = json.loads((work / "run" / "status.json").read_text())
    assert status["state"] == "completed" and status["preflight_outcome"] == "incomplete" and status["exit_code"] == 3
    summary = status["preflight"]
    assert summary["fast_forward"] is False
    assert any("optimizer steps through the automatic probe" in c for c in summary["checked"])
    not_checked = " ".join(summary["not_checked"])
    for words in ("evaluation, checkpoint saving", "epoch boundary", "resuming from a checkpoint", "refused"):
        assert words in not_checked
    refused = {w["path"] for w in summary["outside_writes"] if w["op"] == "refused"}
    assert str((work / "checkpoints" / "last.pt").resolve()) in refused
    assert str((work / "results.json").resolve()) in refused
    assert "NOT checked" in r.stderr and "Delete" not in r.stderr
    assert "run-crashed" not in [f["name"] for f in status["findings"]]  # the refusal is no bug of the script's


def test_a_script_with_no_optimizer_step_is_never_passed(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print('preparing data')\nprint('done')\n")
    r = run_trainguard("preflight", "--run-dir", str(tmp_path / "run"), "--", sys.executable, "train.py",
                       cwd=tmp_path, timeout=120)
    assert r.returncode == 3, r.stderr[-2000:]
    assert "NOT checked: any optimizer step" in r.stderr
