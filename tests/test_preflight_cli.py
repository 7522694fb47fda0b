"""`trainguard preflight` end to end (real subprocesses, real torch, real files): the scratch folder keeps
the user's files untouched, every write outside it is named, bad input is one line with exit 2.

The zoo (scenarios/preflight_*) covers each planted failure and the healthy twins; this file covers what
a scenario's expect.yaml cannot state.
Run: pytest tests/test_preflight_cli.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from tgtest import run_trainguard

SCRIPT = '''
import json, subprocess, sys
import torch
import trainguard

ORIGIN = sys.argv[1]
cfg = json.load(open("config.json"))
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=cfg["lr"])
guard = trainguard.watch(model, opt, total_steps=200)
if guard.resume_from:
    model.load_state_dict(torch.load(guard.resume_from))
for step in range(200):
    loss = model(torch.randn(2, 4)).pow(2).mean()
    loss.backward(); opt.step(); opt.zero_grad()
    guard.step(loss)
    if guard.due("save", every=100):
        torch.save(model.state_dict(), "ckpt/last.pt")      # ckpt/ exists in the user's folder
        guard.checkpoint_saved("ckpt/last.pt")
        cfg["steps_done"] = guard.step_count
        json.dump(cfg, open("config.json", "w"))              # the script rewrites its own config
        with open("log.txt", "a") as fh:                      # appends to an existing file
            fh.write("saved\\n")
        open(ORIGIN + "/results/abs.txt", "w").write("x")    # an absolute path into the project
        subprocess.run(["touch", ORIGIN + "/native.txt"])     # a write no Python hook sees
        subprocess.run(["touch", "ckpt/new-native.bin"])      # a new file by native code, relative
guard.finish()
'''


def test_scratch_keeps_user_files_and_names_outside_writes(tmp_path: Path) -> None:
    proj = tmp_path / "proj"
    (proj / "ckpt").mkdir(parents=True)
    (proj / "results").mkdir()
    (proj / "train.py").write_text(SCRIPT)
    (proj / "config.json").write_text('{"lr": 0.1}')
    (proj / "log.txt").write_text("old line\n")
    old = torch.nn.Linear(4, 1)
    torch.save(old.state_dict(), proj / "ckpt" / "last.pt")
    ckpt_before = (proj / "ckpt" / "last.pt").read_bytes()

    r = run_trainguard("preflight", "--quiet", "--run-dir", str(tmp_path / "run"), "--",
                       sys.executable, "train.py", str(proj), cwd=proj, timeout=120)
    status = json.loads((tmp_path / "run" / "status.json").read_text())
    assert r.returncode == 0, r.stderr  # warnings only
    # the user's files are untouched: config, checkpoint, appended log
    assert (proj / "config.json").read_text() == '{"lr": 0.1}'
    assert (proj / "ckpt" / "last.pt").read_bytes() == ckpt_before
    assert (proj / "log.txt").read_text() == "old line\n"
    assert not (proj / "ckpt" / "new-native.bin").exists()  # folders are mirrored: new files stay in scratch
    # the script ran where its `..` is the user's `..`: below mirrors of the project's two parents
    scratch = Path(status["preflight"]["scratch"])
    assert scratch == tmp_path / "run" / "scratch" / "root" / tmp_path.name / "proj"
    assert (scratch / ".." / "run").exists() is False  # the run folder is never linked into its own scratch
    assert not (scratch / "ckpt" / "last.pt").is_symlink() and (scratch / "ckpt" / "last.pt").is_file()
    assert (scratch / "log.txt").read_text() == "old line\nsaved\n"  # copy on write kept the old content
    assert json.loads((scratch / "config.json").read_text())["steps_done"] == 4
    # the resume ran from the preflight's own checkpoint, in the scratch folder
    assert status["preflight"]["checkpoint"] == str((scratch / "ckpt" / "last.pt").resolve())
    assert status["preflight"]["resume"] == "ok"
    # and every write outside the scratch folder is named
    outside = next(f for f in status["findings"] if f["name"] == "wrote-outside-scratch")
    paths = {w["path"] for w in outside["evidence"]["files"]}
    assert paths == {str((proj / "results" / "abs.txt").resolve()), str((proj / "native.txt").resolve())}
    assert outside["severity"] == "warning"
    assert "wrote-outside-scratch" in r.stderr


def test_bad_input_is_one_line_exit_2(tmp_path: Path) -> None:
    r = run_trainguard("preflight", "--steps", "1", "--", sys.executable, "x.py", cwd=tmp_path)
    assert r.returncode == 2 and "--steps must be at least 2" in r.stderr and "Traceback" not in r.stderr
    r = run_trainguard("preflight", "--run-dir", str(tmp_path / "run"), "--", "no-such-command-xyz", cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "command not found" in r.stderr


def test_script_without_the_probe_is_stopped_at_the_timeout(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("import time\nfor i in range(600):\n    print(i, flush=True)\n    time.sleep(0.1)\n")
    r = run_trainguard("preflight", "--quiet", "--timeout", "3", "--run-dir", str(tmp_path / "run"), "--",
                       sys.executable, "train.py", cwd=tmp_path, timeout=60)
    status = json.loads((tmp_path / "run" / "status.json").read_text())
    assert r.returncode == 1
    assert [f["name"] for f in status["findings"]] == ["preflight-timed-out"]
    # no probe ever started: whether the script calls trainguard.watch() is unknown, and not claimed
    assert "never reached trainguard.watch() or an optimizer step" in r.stderr
    assert "does not call trainguard.watch()" not in r.stderr and "NOT checked: any optimizer step" in r.stderr
