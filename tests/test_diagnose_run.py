"""`trainguard diagnose RUN` on a run folder: how the run ended and what it recorded while it ran (a crash
with its root cause), with what the rules or log readers find now, each finding once.

A new user's run crashed on rank 1; `trainguard diagnose` on its folder said "no findings", because it only
re-ran the health rules over the store. Real runs under `trainguard run`, with and without the probe.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from tgtest import run_trainguard

CRASH = """
import torch, trainguard
m = torch.nn.Linear(4, 1); o = torch.optim.SGD(m.parameters(), lr=0.05)
g = trainguard.watch(m, o, total_steps=30)
for i in range(30):
    loss = m(torch.randn(8, 4)).pow(2).mean()
    loss.backward(); o.step(); o.zero_grad(); g.step(loss)
    print(f"step {i} loss {loss.item():.4f}", flush=True)
    if i == 12:
        raise ValueError("bad batch at step 12")
g.finish()
"""


@pytest.mark.parametrize("probe", [True, False], ids=["probe", "no-probe"])
def test_diagnose_of_a_crashed_run_folder_names_the_crash_once(tmp_path: Path, probe: bool) -> None:
    (tmp_path / "train.py").write_text(CRASH if probe else CRASH.replace("g.step(loss)", "pass"))
    run_dir = tmp_path / "run"
    r = run_trainguard("run", "--run-dir", str(run_dir), *([] if probe else ["--no-auto"]), "--", sys.executable,
                       "train.py", cwd=tmp_path)
    assert r.returncode == 1, r.stderr[-2000:]
    out = run_trainguard("diagnose", str(run_dir))
    assert out.returncode == 1, out.stdout + out.stderr  # an error finding: the crash
    head = out.stdout.splitlines()[0]
    assert head.startswith(f"{run_dir}: crashed (exit code 1)"), out.stdout
    assert "no findings" not in out.stdout
    assert out.stdout.count("TG501 run-crashed [error]") == 1 and "ValueError: bad batch at step 12" in out.stdout
    assert "train.py:10" in out.stdout  # where it raised
    if probe:  # the probe timed it from its start: a crash within the first second is "<1 s", never "0 s"
        crash = next(line for line in out.stdout.splitlines() if "TG501" in line)
        assert "after 0 s" not in crash and "after 0 s" not in r.stderr, crash
        elapsed = json.loads((run_dir / "status.json").read_text())["findings"][0]["evidence"]["elapsed_seconds"]
        assert ("after <1 s" in crash) == (elapsed < 0.95), crash
    as_json = json.loads(run_trainguard("diagnose", "--json", str(run_dir)).stdout)
    assert [f["name"] for f in as_json].count("run-crashed") == 1
    assert not [f for f in as_json if f["name"] == "log-ends-unfinished"]  # the watchdog saw how it ended
