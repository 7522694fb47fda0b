"""The Ultralytics adapter, under `trainguard run`, driven in BaseTrainer's callback order.

Ultralytics itself cannot run here: it needs torchvision, and PyPI's torchvision wheels (0.28, 0.29)
fail to load their operators beside the local torch 2.13.0 CPU wheel ("operator torchvision::nms does
not exist"), and `import ultralytics` fails without it. So tests/integrations/ultralytics_like.py replays
the trainer's sequence with a real torch model, and, where the library's source is installed, the event
names are checked against its own `default_callbacks` table (read as text, never imported).

Run: pytest tests/test_ultralytics.py
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest
from tgtest import run_trainguard

from trainguard.integrations.ultralytics import EVENTS

SCRIPT = Path(__file__).resolve().parent / "integrations" / "ultralytics_like.py"


def test_event_names_are_the_librarys_own() -> None:
    spec = importlib.util.find_spec("ultralytics")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("ultralytics is not installed")
    base = Path(list(spec.submodule_search_locations)[0]) / "utils" / "callbacks" / "base.py"
    known = set(re.findall(r'^\s*"(\w+)": \[', base.read_text(), re.MULTILINE))
    assert set(EVENTS) <= known, set(EVENTS) - known


def run(tmp: Path, plant: str, *args: str) -> dict:
    proc = run_trainguard("run", "--quiet", "--run-dir", str(tmp / "run"), *args, "--", sys.executable, str(SCRIPT),
                          "--plant", plant, cwd=tmp, timeout=180)
    status = json.loads((tmp / "run" / "status.json").read_text())
    return {"rc": proc.returncode, "status": status, "names": [f["name"] for f in status.get("findings") or []]}


def test_healthy_run_recorded_and_quiet(tmp_path: Path) -> None:
    r = run(tmp_path, "none")
    assert r["rc"] == 0 and r["status"]["state"] == "completed" and r["status"]["step"] == 80
    assert [f for f in r["status"]["findings"] if f["severity"] != "info"] == []
    from trainguard.store.reader import RunReader

    with RunReader(tmp_path / "run") as reader:
        rows = list(reader.steps())
        events = reader.events()
    assert len(rows) == 80 and set(rows[5]["parts"]) == {"box_loss", "cls_loss"}
    assert sum(e["kind"] == "eval" for e in events) == 4 and sum(e["kind"] == "checkpoint" for e in events) == 4
    assert {"train", "eval"} <= {e["name"] for e in events if e["kind"] == "phase"}


@pytest.mark.parametrize("plant,name", [("nan", "nonfinite-loss"), ("lr-zero", "lr-reaches-zero")])
def test_planted_failures_found(tmp_path: Path, plant: str, name: str) -> None:
    assert name in run(tmp_path, plant)["names"]


def test_stuck_dataloader_worker_after_validation_is_diagnosed(tmp_path: Path) -> None:
    """Seed 003 through the adapter: validation and a checkpoint, then a worker never returns a batch."""
    r = run(tmp_path, "stuck-worker", "--stall-timeout", "5")
    assert r["status"]["state"] == "hung" and r["rc"] == 124
    hang = next(f for f in r["status"]["findings"] if f["name"] == "run-hung")
    assert hang["cause"] == "dataloader-worker" and "ultralytics_like.py" in hang["where"]
    assert "(__getitem__)" in hang["where"] and hang["step"] > 20  # in the second epoch
    from trainguard.store.reader import RunReader

    with RunReader(tmp_path / "run") as reader:
        kinds = [e["kind"] for e in reader.events() if e["kind"] in ("eval", "checkpoint")]
    assert kinds[:2] == ["eval", "checkpoint"] or kinds[:2] == ["checkpoint", "eval"]


def test_disabled_guard_leaves_training_alone(tmp_path: Path) -> None:
    """TRAINGUARD_DISABLE=1: the adapter gets a NullGuard and the script trains to its end."""
    import os
    import subprocess

    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINGUARD_")}
    env["TRAINGUARD_DISABLE"] = "1"
    proc = subprocess.run([sys.executable, str(SCRIPT)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and "Training complete" in proc.stdout, proc.stderr[-2000:]
