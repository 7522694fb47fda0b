"""`trainguard run` on commands that die without a Python traceback: the cause comes from what they printed.

Real processes, each ending the way such a failure ends: a C++ exception's last words then abort() (SIGABRT),
a segfault, a child killed by SIGKILL under a bash job script (which prints `Killed` and exits 137, as a
SLURM batch script does when the OOM killer takes its python), a launch of a script that does not exist.
The watchdog's crash or kill finding must name the cause the output printed, from the same catalogue
`trainguard diagnose` reads (rules/signatures.py).

    pytest tests/test_signatures_live.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from tgtest import run_trainguard

pytestmark = pytest.mark.process


def _findings(run_dir: Path) -> tuple[dict, list[dict]]:
    status = json.loads((run_dir / "status.json").read_text())
    return status, [f for f in status.get("findings", []) if f["code"] in ("TG501", "TG503")]


def test_cuda_out_of_memory_then_abort_names_the_out_of_memory(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(
        "import os, sys\n"
        "for i in range(1, 4):\n    print(f'step {i} loss {2.0 / i:.3f}', flush=True)\n"
        "sys.stderr.write(\"terminate called after throwing an instance of 'c10::Error'\\n\"\n"
        "                 '  what():  CUDA error: out of memory\\n')\n"
        "sys.stderr.flush()\nos.abort()\n")
    out = run_trainguard("run", "--run-dir", "r", "--", sys.executable, "train.py", cwd=tmp_path)
    status, found = _findings(tmp_path / "r")
    assert out.returncode == 128 + 6 and status["state"] == "killed" and status["signal"] == "SIGABRT"
    assert found and found[0]["cause"] == "cuda-out-of-memory", found
    assert "out of memory" in found[0]["summary"] and "batch size" in found[0]["fix"]


def test_a_segfault_after_faulthandler_names_the_segfault(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(
        "import faulthandler, os, signal\nfaulthandler.enable()\nprint('step 1 loss 1.0', flush=True)\n"
        "os.kill(os.getpid(), signal.SIGSEGV)\n")
    run_trainguard("run", "--run-dir", "r", "--", sys.executable, "train.py", cwd=tmp_path)
    status, found = _findings(tmp_path / "r")
    assert status["signal"] == "SIGSEGV" and found[0]["cause"] == "segfault"
    assert "PYTHONFAULTHANDLER" in found[0]["fix"]


def test_a_job_script_whose_python_is_killed_is_a_kill_not_a_crash(tmp_path: Path) -> None:
    # bash reports its child's SIGKILL ("line 1: PID Killed ...") and exits 128 + 9
    (tmp_path / "job.sh").write_text(
        f"{sys.executable} -c 'import os, signal; print(\"step 1 loss 1.0\", flush=True); "
        "os.kill(os.getpid(), signal.SIGKILL)'\nexit $?\n")
    out = run_trainguard("run", "--run-dir", "r", "--", "bash", "job.sh", cwd=tmp_path)
    status, found = _findings(tmp_path / "r")
    assert out.returncode == 137 and status["state"] == "killed" and status["signal"] == "SIGKILL"
    assert found[0]["code"] == "TG503" and "Killed" in found[0]["evidence"]["quote"]


def test_a_script_that_does_not_exist_is_a_failed_launch(tmp_path: Path) -> None:
    out = run_trainguard("run", "--run-dir", "r", "--", sys.executable, "trian.py", cwd=tmp_path)
    status, found = _findings(tmp_path / "r")
    assert out.returncode == 2 and status["state"] == "crashed"
    assert found[0]["code"] == "TG501" and found[0]["cause"] == "script-not-found", found
    assert "can't open file" in found[0]["evidence"]["quote"]
