"""An unfinished guard: a warning for a script that simply never calls `guard.finish()`, an error (exit 123)
when the evidence says it stopped early. Real scripts under `trainguard run` and alone, real exits.

Which is which (rules/ending.py): exit 0 through the interpreter's normal exit with steps made and no
declared `total_steps` it fell short of is `completed` with a TG506 warning and the command's exit code;
`os._exit(0)`, a `sys.exit(0)` before the declared total, or no step at all is `failed`, TG506 error, 123.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from tgtest import run_trainguard

from trainguard.store.status import read_status

SCRIPT = """
import os, sys, torch, trainguard
total = int(os.environ["TOTAL"]) if os.environ.get("TOTAL") else None
m = torch.nn.Linear(2, 1); o = torch.optim.SGD(m.parameters(), lr=0.1)
g = trainguard.watch(m, o, total_steps=total)
for i in range(int(os.environ.get("STEPS", "5"))):
    m(torch.randn(2, 2)).sum().backward(); o.step(); o.zero_grad(); g.step(torch.tensor(1.0))
print("trained", flush=True)
if os.environ.get("END") == "os_exit":
    os._exit(0)
sys.exit(0)  # no guard.finish()
"""

CASES = [
    # (environment, state, severity, trainguard's exit code, what the summary says)
    ({}, "completed", "warning", 0, "no sign that it stopped early"),
    ({"TOTAL": "5"}, "completed", "warning", 0, "no sign that it stopped early"),
    ({"TOTAL": "10"}, "failed", "error", 123, "stopped at step 5 of the 10 declared"),
    ({"END": "os_exit"}, "failed", "error", 123, "never reached its normal exit"),
    ({"STEPS": "0"}, "failed", "error", 123, "made no training step"),
]


@pytest.mark.parametrize("env, state, severity, code, says", CASES, ids=["forgot", "forgot-at-total", "short",
                                                                         "os-exit", "no-step"])
def test_an_unfinished_guard_under_trainguard_run(tmp_path: Path, env: dict, state: str, severity: str,
                                                   code: int, says: str) -> None:
    (tmp_path / "train.py").write_text(SCRIPT)
    run_dir = tmp_path / "run"
    r = run_trainguard("run", "--run-dir", str(run_dir), "--", sys.executable, "train.py", cwd=tmp_path, env=env)
    assert r.returncode == code, r.stderr[-2000:]
    status = read_status(run_dir)
    assert status["state"] == state and status["exit_code"] == 0, status
    (f,) = [f for f in status["findings"] if f["name"] == "probe-not-finished"]
    assert f["severity"] == severity and says in f["summary"], f
    assert "guard.finish()" in f["fix"]
    assert f"run {state}" in r.stderr


@pytest.mark.parametrize("env, state, severity", [({}, "completed", "warning"), ({"TOTAL": "10"}, "failed", "error")])
def test_an_unfinished_guard_in_a_script_run_alone(tmp_path: Path, env: dict, state: str, severity: str) -> None:
    (tmp_path / "train.py").write_text(SCRIPT)
    full = {k: v for k, v in os.environ.items() if not k.startswith("TRAINGUARD_")}
    out = subprocess.run([sys.executable, "train.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env={**full, **env})
    assert out.returncode == 0, out.stderr
    (run,) = (tmp_path / "trainguard-runs").iterdir()
    status = read_status(run)
    assert status["state"] == state, status
    assert [(f["name"], f["severity"]) for f in status["findings"]] == [("probe-not-finished", severity)]


INTERRUPTED_ALONE = """
import sys, time, torch, trainguard
m = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(m.parameters(), lr=0.1)
guard = trainguard.watch(m, opt, total_steps=1000, run_dir="run")
for i in range(1000):
    loss = m(torch.randn(8, 4)).pow(2).mean()
    loss.backward()
    guard.step(loss)
    opt.step()
    opt.zero_grad()
    if i == 20:
        print("step 20", flush=True)
    time.sleep(0.01)
guard.finish()
"""


def test_ctrl_c_in_a_script_run_alone_is_an_interrupt_not_an_unfinished_guard(tmp_path: Path) -> None:
    """A real SIGINT to a script watching itself: killed by SIGINT (TG503, cause interrupted), its steps kept;
    not "failed: call guard.finish()" (TG506), which is what it said before."""
    import signal

    (tmp_path / "train.py").write_text(INTERRUPTED_ALONE)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINGUARD_")}
    proc = subprocess.Popen([sys.executable, "train.py"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=lambda: signal.signal(signal.SIGINT,
                                                                                                signal.SIG_DFL))
    assert proc.stdout is not None
    assert proc.stdout.readline().startswith("step 20")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert "KeyboardInterrupt" in err
    status = read_status(tmp_path / "run")
    names = {f["name"]: f for f in status["findings"]}
    assert status["state"] == "killed" and "probe-not-finished" not in names, status
    assert names["run-killed"]["cause"] == "interrupted" and status["step"] >= 20, status
