"""As an ordinary user, where py-spy has no ptrace rights, the probe's signal dump must still name the hang.

    TRAINGUARD_TEST_NOBODY_PYTHON=/path/to/python pytest tests/test_hang_user.py

Runs `trainguard run` as the user `nobody` (via runuser; needs root) on a script whose DataLoader worker
is stuck. The script marks itself non-dumpable (prctl PR_SET_DUMPABLE 0, inherited by forked workers),
which is how the kernel denies ptrace to a process of the same user: py-spy then fails exactly as it
does under Yama or without CAP_SYS_PTRACE, and the stacks must come from the probe's signal handler.
The interpreter must be one `nobody` can execute with trainguard and torch importable: this test's own
interpreter, or the one named in TRAINGUARD_TEST_NOBODY_PYTHON; otherwise the test skips and says why.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

SCRIPT = textwrap.dedent('''
    import ctypes, sys, threading
    import torch
    import trainguard

    ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 0: no ptrace for the same user (py-spy fails)

    class Items(torch.utils.data.Dataset):
        def __len__(self):
            return 32

        def __getitem__(self, idx):
            if idx == 21:
                threading.Event().wait()  # PLANTED
            return torch.zeros(2)

    if __name__ == "__main__":
        guard = trainguard.watch()
        for batch in guard.batches(torch.utils.data.DataLoader(Items(), batch_size=2, num_workers=2)):
            guard.step(1.0)
''')


def _nobody_python() -> str:
    if os.geteuid() != 0 or shutil.which("runuser") is None:
        pytest.skip("needs root and runuser to run as the user nobody")
    python = os.environ.get("TRAINGUARD_TEST_NOBODY_PYTHON", sys.executable)
    probe = subprocess.run(["runuser", "-u", "nobody", "--", python, "-c", "import torch, trainguard"],
                           capture_output=True, text=True, timeout=120)
    if probe.returncode != 0:
        pytest.skip(f"nobody cannot run {python} with torch and trainguard ({probe.stderr.strip()[-200:]}); "
                    "set TRAINGUARD_TEST_NOBODY_PYTHON to an interpreter outside a private home")
    return python


def test_signal_dump_names_a_stuck_worker_when_py_spy_is_denied() -> None:
    python = _nobody_python()
    # pytest's own tmp folders sit under a folder only root may enter
    tmp_path = Path(tempfile.mkdtemp(prefix="tg-nobody-"))
    tmp_path.chmod(0o777)
    try:
        _run_as_nobody(python, tmp_path)
    finally:
        shutil.rmtree(tmp_path, ignore_errors=True)


def _run_as_nobody(python: str, tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINGUARD_")}
    env["HOME"] = str(tmp_path)
    r = subprocess.run(["runuser", "-u", "nobody", "--", python, "-m", "trainguard.cli", "run", "--quiet",
                        "--run-dir", str(tmp_path / "run"), "--stall-timeout", "5", "--", python, "train.py"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 124, r.stderr
    status = json.loads((tmp_path / "run" / "status.json").read_text())
    hang = next(f for f in status["findings"] if f["name"] == "run-hung")
    line = next(i for i, t in enumerate(SCRIPT.splitlines(), 1) if "PLANTED" in t)
    assert hang["cause"] == "dataloader-worker"
    assert hang["where"].endswith(f"train.py:{line} (__getitem__)")
    assert set(hang["evidence"]["stack_sources"].values()) == {"signal"}
    assert hang["evidence"].get("sample_index") is None  # only py-spy reads locals, and it was denied
    # and py-spy really is denied here: as nobody it cannot read a non-dumpable process of nobody's
    spy = Path(python).parent / "py-spy"
    if spy.exists():
        check = textwrap.dedent(f"""
            import subprocess, sys, time
            p = subprocess.Popen([sys.executable, "-c",
                                  "import ctypes, time; ctypes.CDLL(None).prctl(4, 0, 0, 0, 0); time.sleep(30)"])
            time.sleep(1.0)
            r = subprocess.run([{str(spy)!r}, "dump", "--pid", str(p.pid)], capture_output=True, text=True)
            p.kill()
            sys.exit(r.returncode)
        """)
        denied = subprocess.run(["runuser", "-u", "nobody", "--", python, "-c", check], capture_output=True,
                                text=True, timeout=60)
        assert denied.returncode != 0, "py-spy could read the process: this test would not show the fallback"


UNINSTRUMENTED = textwrap.dedent('''
    import ctypes, threading, time
    ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 0: py-spy is denied
    lock = threading.Lock()
    print("working", flush=True)
    with lock:
        lock.acquire()  # a self-deadlock, in a script without the probe
''')


def test_without_the_probe_and_without_ptrace_the_hang_is_unknown_and_says_why() -> None:
    # --no-auto: not even the automatic probe's signal dump (tests/test_hang_noptrace.py has it on)
    python = _nobody_python()
    tmp_path = Path(tempfile.mkdtemp(prefix="tg-nobody-"))
    tmp_path.chmod(0o777)
    try:
        (tmp_path / "train.py").write_text(UNINSTRUMENTED)
        env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINGUARD_")}
        env["HOME"] = str(tmp_path)
        r = subprocess.run(["runuser", "-u", "nobody", "--", python, "-m", "trainguard.cli", "run", "--quiet",
                            "--run-dir", str(tmp_path / "run"), "--stall-timeout", "3", "--hang-limit", "12",
                            "--no-auto", "--", python, "train.py"],
                           cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)
        assert r.returncode == 124, r.stderr
        status = json.loads((tmp_path / "run" / "status.json").read_text())
        # no stacks, so no proof: reported as a stall at once, stopped when it outlasts --hang-limit
        stalled = next(f for f in status["findings"] if f["name"] == "run-stalled")
        assert stalled["evidence"]["detected_at"] - stalled["evidence"]["last_progress_at"] <= 3 + 15
        hang = next(f for f in status["findings"] if f["name"] == "run-hung")
        assert "past its limit" in hang["evidence"]["stopped_because"]
        # trainguard does not guess: no stacks, so no cause, and the finding says what was missing
        assert hang["cause"] == "unknown" and "where" not in hang
        if (Path(python).parent / "py-spy").exists():
            assert "ptrace" in hang["summary"] or "ermission" in hang["summary"], hang["summary"]
    finally:
        shutil.rmtree(tmp_path, ignore_errors=True)
