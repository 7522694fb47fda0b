"""SIGKILL of the training process leaves a readable run folder whose events stop < ~1 s before the kill.

The child prints the wall time of each step after `guard.step`; the parent kills it with SIGKILL at a
moment it does not choose in advance, then compares the last step in the store with the last step the
child reported. Real process, real signal, real SQLite.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

CHILD = """
import sys, time, torch, trainguard
model = torch.nn.Linear(16, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
guard = trainguard.watch(model, opt, run_dir=sys.argv[1])
while True:
    loss = model(torch.randn(8, 16)).pow(2).mean()
    loss.backward(); opt.step(); opt.zero_grad()
    guard.step(loss)
    print(guard.step_count, time.time(), flush=True)
    time.sleep(0.002)
"""


def test_sigkill_loses_at_most_about_a_second(tmp_path: Path) -> None:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, str(script), str(run_dir)], stdout=subprocess.PIPE, text=True)
    last_line = ""
    deadline = time.time() + 60
    killed_at = None
    while time.time() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        last_line = line
        step = int(line.split()[0])
        if step >= 400:  # well into the run, a couple of seconds in
            os.kill(proc.pid, signal.SIGKILL)
            killed_at = time.time()
            break
    proc.wait(timeout=30)
    assert killed_at is not None, "child never reached step 400"
    assert proc.returncode == -signal.SIGKILL
    reported_step = int(last_line.split()[0])
    conn = sqlite3.connect(run_dir / "run.db")
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    last_step, last_t = conn.execute("SELECT step, t FROM steps ORDER BY rowid DESC LIMIT 1").fetchone()
    assert killed_at - last_t < 1.0, f"last stored step {last_step} is {killed_at - last_t:.2f} s before the kill"
    assert reported_step - last_step < 400, "most steps were lost"
    # the run folder is readable by the CLI, which says the process is gone
    out = subprocess.run([sys.executable, "-m", "trainguard.cli", "status", str(run_dir)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "process is gone" in out.stdout
