"""The zoo's hang scenarios without the probe, classified with cause and `where` when py-spy cannot help.

Two ways py-spy fails in the field, each on the unmodified scripts of the zoo's no-probe hangs (busy
loop, lock-order deadlock, stuck DataLoader worker, a write into a FIFO nobody reads):
- py-spy absent (`TRAINGUARD_PY_SPY=0`, as on an install without it);
- ptrace refused: `trainguard run` runs without CAP_SYS_PTRACE (setpriv; needs root) and the script
  is started non-dumpable (prctl PR_SET_DUMPABLE 0, inherited by forked workers), which is how the
  kernel refuses ptrace to a process of the same user; the test checks py-spy really is refused.
The stacks must then come from the bootstrap's signal dump (`trainguard run`'s automatic probe).

    pytest -q -n 0 tests/test_hang_noptrace.py
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import zoo
from tgtest import trainguard_cmd

HANGS = ["seed000_busy_loop_noprobe", "deadlock_lock_order_noprobe", "seed003_dataloader_worker_stuck_noprobe",
         "checkpoint_write_blocks_noprobe"]
# runs train.py as its own __main__, made non-dumpable first (the script itself is unchanged)
NON_DUMPABLE = ("import ctypes, runpy, sys; ctypes.CDLL(None).prctl(4, 0, 0, 0, 0); sys.argv = ['train.py']; "
                "runpy.run_path('train.py', run_name='__main__')")
NO_PTRACE = ["setpriv", "--inh-caps=-sys_ptrace", "--bounding-set=-sys_ptrace"]


def _run(name: str, tmp_path: Path, *, prefix: list[str], command: list[str], env: dict[str, str]) -> dict:
    exp = zoo.load_expect(name)
    work = tmp_path / name
    shutil.copytree(zoo.HERE / name, work)
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINGUARD_")}
    full_env.update(env)
    cmd = prefix + trainguard_cmd("run", "--quiet", "--run-dir", str(work / "run"),
                                  *[str(a) for a in exp.get("args", [])], "--", *command)
    r = subprocess.run(cmd, cwd=work, env=full_env, capture_output=True, text=True, timeout=float(exp["timeout"]))
    status = json.loads((work / "run" / "status.json").read_text())
    assert r.returncode == exp["exit_code"], r.stderr[-2000:]
    hang = next(f for f in status["findings"] if f["name"] == "run-hung")
    assert hang["cause"] == exp["cause"], hang["summary"]
    assert exp["where"] in (hang.get("where") or ""), hang
    stuck = str(hang["evidence"]["stuck_pid"])
    assert hang["evidence"]["stack_sources"][stuck] == "signal", hang["evidence"]["stack_sources"]
    return hang


@pytest.mark.parametrize("name", HANGS)
def test_classified_without_py_spy(name: str, tmp_path: Path) -> None:
    _run(name, tmp_path, prefix=[], command=[sys.executable, "train.py"], env={"TRAINGUARD_PY_SPY": "0"})


def _py_spy_refused() -> None:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to run trainguard without CAP_SYS_PTRACE")
    spy = Path(sys.executable).parent / "py-spy"
    if not spy.exists():
        pytest.skip("py-spy is not installed beside this interpreter: nothing to refuse")
    check = ("import subprocess, sys, time\n"
             "p = subprocess.Popen([sys.executable, '-c', 'import ctypes, time; "
             "ctypes.CDLL(None).prctl(4, 0, 0, 0, 0); time.sleep(30)'])\n"
             f"time.sleep(1.0)\nr = subprocess.run([{str(spy)!r}, 'dump', '--pid', str(p.pid)], capture_output=True)\n"
             "p.kill()\nsys.exit(r.returncode)\n")
    denied = subprocess.run(NO_PTRACE + [sys.executable, "-c", check], capture_output=True, timeout=60)
    assert denied.returncode != 0, "py-spy could read the process: this test would not show the fallback"


@pytest.mark.parametrize("name", HANGS)
def test_classified_when_ptrace_is_refused(name: str, tmp_path: Path) -> None:
    _py_spy_refused()
    hang = _run(name, tmp_path, prefix=NO_PTRACE, command=[sys.executable, "-c", NON_DUMPABLE], env={})
    if hang["cause"] == "dataloader-worker":
        # only py-spy reads a worker's local variables; the finding says why the index is missing
        assert hang["evidence"].get("sample_index") is None
        assert "ptrace" in hang["evidence"]["sample_index_unread"], hang["evidence"]
