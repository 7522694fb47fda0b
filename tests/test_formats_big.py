"""`trainguard diagnose` of a ~150 MB trainer_state.json streams it: peak memory stays bounded.

A long Hugging Face run's trainer_state.json holds every log call; reading it whole took 775 MB for a
139 MB file. The file is generated here (1.1 million log rows, the Trainer's own sorted keys with the plan
after `log_history`) and diagnosed in a real subprocess, whose peak RSS is read from the kernel.

Run: pytest tests/test_formats_big.py -m slow      (about a minute)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

PEAK_RSS_MB = 200


def write_state(path: Path, rows: int) -> None:
    with open(path, "w") as f:
        f.write('{\n  "best_metric": null,\n  "epoch": 3.0,\n  "eval_steps": 5000,\n'
                f'  "global_step": {rows},\n  "log_history": [\n')
        for s in range(1, rows + 1):
            rec = {"epoch": round(3 * s / rows, 6), "grad_norm": 1.0 + (s % 7) / 10,
                   "learning_rate": 5e-5 * (1 - s / rows), "loss": 2.0 / (1 + s / 1000) + (s % 13) / 100, "step": s}
            f.write("    " + json.dumps(rec) + (",\n" if s < rows else "\n"))
        f.write(f'  ],\n  "logging_steps": 1,\n  "max_steps": {rows},\n  "num_train_epochs": 3,\n'
                '  "save_steps": 5000,\n  "total_flos": 1e18\n}\n')


def test_huge_trainer_state_is_streamed(tmp_path: Path) -> None:
    state = tmp_path / "trainer_state.json"
    write_state(state, 1_150_000)
    assert state.stat().st_size > 140 << 20
    # VmHWM, not getrusage's ru_maxrss: the kernel carries ru_maxrss across exec, so a child forked from a
    # big test worker reported the worker's peak (440 MB in CI); VmHWM belongs to the new image alone
    code = ("import re, sys\nfrom trainguard.cli import main\n"
            "try:\n    main(['diagnose', sys.argv[1], '--json'])\nexcept SystemExit:\n    pass\n"
            "print(re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1), file=sys.stderr)\n")
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code, str(state)], capture_output=True, text=True, timeout=900,
                          env={**os.environ})
    took = time.monotonic() - start
    peak_mb = int(proc.stderr.strip().splitlines()[-1]) / 1024  # Linux: kilobytes
    report = json.loads(proc.stdout)
    assert report["steps"] == 1_150_000 and report["state"] == "completed", proc.stderr[-2000:]
    assert peak_mb < PEAK_RSS_MB, f"peak RSS {peak_mb:.0f} MB"
    assert took < 600, f"{took:.0f} s"
