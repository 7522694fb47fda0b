"""Small manners of the command line, each as a new user meets it: a mistyped option gets "did you mean",
`ls` piped shows whole run names, `check --fix` keeps the YAML's comments, and preflight does not flag
the log file the shell redirected its own output into.

    .venv/bin/python -m pytest -q -n 0 tests/test_cli_manners.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tgtest import run_trainguard, trainguard_cmd


def test_a_mistyped_option_is_answered_with_did_you_mean(workdir: Path) -> None:
    for args, typo, meant in ((["run", "--stall-timout", "5", "--", "true"], "--stall-timout", "--stall-timeout"),
                              (["run", "--quite", "--", "true"], "--quite", "--quiet"),
                              (["preflight", "--step", "3", "--", "python", "x.py"], "--step", "--steps"),
                              (["status", "--jsn"], "--jsn", "--json")):
        out = run_trainguard(*args, cwd=workdir)
        assert out.returncode == 2, (args, out.returncode, out.stderr)
        (line,) = out.stderr.strip().splitlines()
        assert line.startswith("trainguard: error: No such option") and typo in line and meant in line, line
        assert "command not found" not in line
    assert not (workdir / "trainguard-runs").exists()  # nothing was started
    # a real command after our options still runs, its own options untouched
    ok = run_trainguard("run", "--run-dir", "r", "--", sys.executable, "-c", "import sys; print(sys.argv[1:])",
                        "--stall-timout", cwd=workdir)
    assert ok.returncode == 0 and "['--stall-timout']" in ok.stdout, ok.stderr


def test_ls_prints_whole_run_names_when_piped(workdir: Path) -> None:
    long_name = "2026-a-run-whose-name-is-much-longer-than-any-terminal-column-would-allow-for-it"
    out = run_trainguard("run", "--run-dir", f"runs/{long_name}", "--", "true", cwd=workdir)
    assert out.returncode == 0, out.stderr
    listed = run_trainguard("ls", "--root", "runs", cwd=workdir)  # stdout is a pipe here
    assert listed.returncode == 0
    row = next(ln for ln in listed.stdout.splitlines() if "completed" in ln)
    assert row.split()[0] == long_name
    assert row.split()[-1] == "true"  # the command, whole, last


def test_check_fix_keeps_the_yaml_comments(workdir: Path) -> None:
    cfg = workdir / "train.yaml"
    cfg.write_text(
        "# distillation run for the 1B student; see docs/runs.md\n"
        "training:\n"
        "  num_train_epochs: 3\n"
        "  per_device_train_batch_size: 4   # what fits on one H200\n"
        "  gradient_accumulation_steps: 16\n"
        "  max_steps: 75000               # the length agreed with the team\n"
        "  learning_rate: 3.0e-4\n"
        "  warmup_steps: 2000\n"
        "  lr_scheduler_type: cosine\n"
        "dataset_size: 100000  # tokenized samples after filtering\n"
    )
    fixed = workdir / "train.fixed.yaml"
    out = run_trainguard("check", str(cfg), "--fix", "--output", str(fixed), cwd=workdir)
    assert "fixed training.max_steps: 75000 -> 4686" in out.stdout, out.stdout + out.stderr
    text = fixed.read_text()
    for comment in ("# distillation run for the 1B student; see docs/runs.md", "# what fits on one H200",
                    "# the length agreed with the team", "# tokenized samples after filtering"):
        assert comment in text, text
    assert "  max_steps: 4686" in text and "learning_rate: 3.0e-4" in text  # changed value; others as written
    assert [ln.split(":")[0] for ln in text.splitlines() if ":" in ln] == \
        [ln.split(":")[0] for ln in cfg.read_text().splitlines() if ":" in ln]  # same keys, same order
    # the diff shows exactly the lines that changed
    removed = [ln for ln in out.stdout.splitlines() if ln.startswith("-") and not ln.startswith("---")]
    assert all("max_steps" in ln or "warmup_steps" in ln for ln in removed), removed


PREFLIGHT_SCRIPT = '''
import torch, trainguard
torch.manual_seed(0); torch.set_num_threads(1)
model = torch.nn.Linear(4, 1); opt = torch.optim.SGD(model.parameters(), lr=0.01)
guard = trainguard.watch(model, opt, total_steps=50)
for step in range(50):
    loss = model(torch.randn(8, 4)).pow(2).mean(); loss.backward(); opt.step(); opt.zero_grad()
    guard.step(loss)
    if guard.due("report", every=25):
        open(__import__("sys").argv[1], "w").write("a file the script writes into the work folder by its real path")
guard.finish()
'''


def test_preflight_does_not_flag_the_file_its_output_was_redirected_into(workdir: Path) -> None:
    (workdir / "train.py").write_text(PREFLIGHT_SCRIPT)
    real_write = workdir / "results.txt"
    cmd = " ".join(trainguard_cmd("preflight", "--run-dir", "pf", "--", sys.executable, "train.py", str(real_write)))
    env = {k: v for k, v in os.environ.items() if k != "TRAINGUARD_RUN_DIR"}
    done = subprocess.run(["sh", "-c", f"{cmd} > preflight.log 2>&1"], cwd=workdir, env=env, timeout=180)
    log = (workdir / "preflight.log").read_text()
    assert done.returncode == 0, log
    status = json.loads((workdir / "pf" / "status.json").read_text())
    flagged = [f for f in status["findings"] if f["code"] == "TG608"]
    paths = [w["path"] for f in flagged for w in f["evidence"]["files"]]
    assert not any(p.endswith("preflight.log") for p in paths), paths
    assert any(p.endswith("results.txt") for p in paths), (paths, log)  # a real write is still named
    listed = json.loads((workdir / "pf" / "preflight.json").read_text())["outside_writes"]
    names = [Path(w["path"]).name for w in listed]  # temp and cache folders are listed too, not flagged
    assert "results.txt" in names and "preflight.log" not in names, names
