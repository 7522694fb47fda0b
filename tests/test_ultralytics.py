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
RULES = importlib.util.find_spec("trainguard.rules.engine") is not None


def test_event_names_are_the_librarys_own() -> None:
    spec = importlib.util.find_spec("ultralytics")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("ultralytics is not installed")
    base = Path(list(spec.submodule_search_locations)[0]) / "utils" / "callbacks" / "base.py"
    known = set(re.findall(r'^\s*"(\w+)": \[', base.read_text(), re.MULTILINE))
    assert set(EVENTS) <= known, set(EVENTS) - known


def run(tmp: Path, plant: str) -> dict:
    proc = run_trainguard("run", "--quiet", "--run-dir", str(tmp / "run"), "--", sys.executable, str(SCRIPT),
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


@pytest.mark.skipif(not RULES, reason="the health rules engine is not in this build")
@pytest.mark.parametrize("plant,name", [("nan", "nonfinite-loss"), ("lr-zero", "lr-reaches-zero")])
def test_planted_failures_found(tmp_path: Path, plant: str, name: str) -> None:
    assert name in run(tmp_path, plant)["names"]
