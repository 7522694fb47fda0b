"""The Ultralytics adapter with the real library: a tiny YOLO detector trained on the CPU, offline.

Ultralytics needs torchvision, and the only torchvision wheels for the pinned CPU torch 2.13.0 are CUDA
builds whose C++ operators cannot load; tests/integrations/torchvision_cpu_ops.py stands in for the one
operator detection uses (`nms`, in plain torch) so the real torchvision package and the real Ultralytics
trainer, validator and data loaders run. They live in their own virtual environment, never in the
project's .venv (transformers imports torchvision when it is installed): `./dev test` creates
`.venv-ultralytics` and names its interpreter in ULTRALYTICS_PYTHON. Without it these tests skip, unless
ULTRALYTICS_PYTHON is set, which makes a missing or broken interpreter a failure.

Each test trains tests/integrations/ultralytics_train.py under `trainguard run` (6 epochs of 8 batches).

Run: pytest tests/test_ultralytics.py
"""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tgtest import ROOT, run_trainguard

from trainguard.integrations.ultralytics import EVENTS

HERE = Path(__file__).resolve().parent / "integrations"
SCRIPT = HERE / "ultralytics_train.py"
sys.path.insert(0, str(HERE))
from torchvision_cpu_ops import nms  # noqa: E402


def ultralytics_python() -> str:
    named = os.environ.get("ULTRALYTICS_PYTHON")
    path = named or str(ROOT / ".venv-ultralytics" / "bin" / "python")
    if not named and not os.path.exists(path):
        pytest.skip("no Ultralytics environment: ./dev test creates .venv-ultralytics (or set ULTRALYTICS_PYTHON)")
    assert os.access(path, os.X_OK), f"ULTRALYTICS_PYTHON={path} is not an interpreter"
    return path


def offline_env(tmp: Path) -> dict[str, str]:
    return {"YOLO_OFFLINE": "1", "YOLO_CONFIG_DIR": str(tmp / "yolo-config"), "MPLCONFIGDIR": str(tmp / "mpl"),
            "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}


def train(tmp: Path, plant: str, *args: str, epochs: int = 6) -> dict:
    proc = run_trainguard("run", "--quiet", "--run-dir", str(tmp / "run"), *args, "--", ultralytics_python(),
                          str(SCRIPT), "--plant", plant, "--epochs", str(epochs), cwd=tmp, timeout=240,
                          env=offline_env(tmp))
    status = json.loads((tmp / "run" / "status.json").read_text())
    output = (tmp / "run" / "output.log").read_text(errors="replace")
    return {"rc": proc.returncode, "status": status, "output": output,
            "names": [f["name"] for f in status.get("findings") or []]}


def events(run_dir: Path) -> tuple[list[dict], list[dict]]:
    from trainguard.store.reader import RunReader

    with RunReader(run_dir) as reader:
        return list(reader.steps()), reader.events()


def diagnose(path: Path) -> subprocess.CompletedProcess:
    return run_trainguard("diagnose", str(path), "--json", timeout=60)


def test_event_names_are_the_librarys_own() -> None:
    """The adapter's events are in the installed library's own callback table (its source, read as text)."""
    out = subprocess.run([ultralytics_python(), "-c", "import importlib.util as u; "
                          "print(u.find_spec('ultralytics').submodule_search_locations[0])"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    base = Path(out.stdout.strip()) / "utils" / "callbacks" / "base.py"
    known = set(re.findall(r'^\s*"(\w+)": \[', base.read_text(), re.MULTILINE))
    assert len(known) > 10 and set(EVENTS) <= known, set(EVENTS) - known


def test_stand_in_nms_keeps_the_best_of_each_overlapping_group() -> None:
    boxes = torch.tensor([[0, 0, 10, 10], [1, 1, 11, 11], [20, 20, 30, 30], [0, 0, 10, 10], [21, 20, 31, 30.]])
    scores = torch.tensor([0.5, 0.9, 0.3, 0.1, 0.8])
    assert nms(boxes, scores, 0.5).tolist() == [1, 4]
    assert nms(boxes, scores, 0.95).tolist() == [1, 4, 0, 2]  # identical boxes 0 and 3: IoU 1
    assert nms(boxes[:0], scores[:0], 0.5).tolist() == []


def test_healthy_run_recorded_and_quiet(tmp_path: Path) -> None:
    r = train(tmp_path, "none")
    assert r["rc"] == 0 and r["status"]["state"] == "completed", r["output"][-3000:]
    assert r["status"]["step"] == 48  # 6 epochs of 8 batches, one optimizer step each (nbs == batch)
    assert [f for f in r["status"]["findings"] if f["severity"] != "info"] == []
    nms_calls = int(re.search(r"nms calls (\d+)", r["output"]).group(1))
    assert nms_calls > 0  # validation ran through torchvision.ops.nms
    rows, evs = events(tmp_path / "run")
    assert len(rows) == 48 and set(rows[5]["parts"]) == {"box_loss", "cls_loss", "dfl_loss"}
    # one validation per epoch, and the library's final validation of best.pt (on_fit_epoch_end again)
    assert sum(e["kind"] == "eval" for e in evs) == 7 and sum(e["kind"] == "checkpoint" for e in evs) == 6
    assert {"train", "eval"} <= {e["name"] for e in evs if e["kind"] == "phase"}
    evals = [e for e in evs if e["kind"] == "eval"]
    assert "metrics_mAP50(B)" in evals[0]["data"] and "val_box_loss" in evals[0]["data"]

    # trainguard diagnose on what the library wrote: its results.csv and its save_dir
    save_dir = tmp_path / "runs" / "train"
    with open(save_dir / "results.csv", newline="") as f:
        epochs = list(csv.DictReader(f))
    assert len(epochs) == 6 and "lr/pg0" in epochs[0]
    for path in (save_dir / "results.csv", save_dir):
        proc = diagnose(path)
        assert proc.returncode == 0, proc.stderr
        report = json.loads(proc.stdout)
        assert report["format"] == "ultralytics results.csv" and report["path"].endswith("results.csv")
        assert report["steps"] == 6 and report["evals"] == 6 and report["skipped"] == 0
        assert [f for f in report["findings"] if f["severity"] != "info"] == []


def test_schedule_that_reaches_zero_found_live_and_in_results_csv(tmp_path: Path) -> None:
    """A schedule sized for a third of 15 epochs: the LR is 0 for the last 10 (80 steps, 10 results.csv rows)."""
    r = train(tmp_path, "lr-zero", epochs=15)
    assert r["rc"] in (0, 122) and r["status"]["state"] == "completed", r["output"][-3000:]
    found = {f["name"]: f for f in r["status"]["findings"]}
    assert found["lr-reaches-zero"]["step"] == 41  # the first step of the sixth epoch
    proc = diagnose(tmp_path / "runs" / "train" / "results.csv")
    assert proc.returncode == 1, proc.stderr  # an error finding
    assert "lr-reaches-zero" in [f["name"] for f in json.loads(proc.stdout)["findings"]]


def test_nan_found_although_ultralytics_recovers_from_it(tmp_path: Path) -> None:
    """A NaN weight at the start of epoch 3: every loss is NaN until Ultralytics reloads last.pt."""
    r = train(tmp_path, "nan")
    assert r["rc"] in (0, 122) and r["status"]["state"] == "completed", r["output"][-3000:]
    first = next(f for f in r["status"]["findings"] if f["name"] == "nonfinite-loss")
    assert first["step"] == 17
    assert "recovering from last.pt" in r["output"]


def test_optimizer_over_a_copy_of_the_model_found(tmp_path: Path) -> None:
    """The optimizer steps a copy: no weight of the model trained ever moves."""
    r = train(tmp_path, "frozen")
    found = {f["name"]: f for f in r["status"]["findings"]}
    assert found["weights-not-updating"]["cause"] == "not-in-optimizer", found["weights-not-updating"]
    assert found["params-without-grad"]["evidence"]["count"] == found["params-without-grad"]["evidence"][
        "total_trainable"]


def test_stuck_dataloader_worker_after_validation_is_diagnosed(tmp_path: Path) -> None:
    """Seed 003: validation and a checkpoint, then a DataLoader worker never returns a batch."""
    # The worker polls for a file that never goes away: a wait on the world is no proof of a hang, so the
    # stall is reported at the timeout and the run stopped when it outlasts its limit.
    r = train(tmp_path, "stuck-worker", "--stall-timeout", "5", "--hang-limit", "25")
    assert r["status"]["state"] == "hung" and r["rc"] == 124, r["output"][-3000:]
    hang = next(f for f in r["status"]["findings"] if f["name"] == "run-hung")
    assert hang["cause"] == "dataloader-worker"
    assert "ultralytics_train.py" in hang["where"] and "(__call__)" in hang["where"]  # WaitAfterValidation
    assert "dataloader-worker" in {p["role"] for p in hang["evidence"]["per_process"]}
    assert 8 <= hang["step"] <= 12  # in the second epoch: at most 4 of its batches were prefetched (prefetch 4)
    _, evs = events(tmp_path / "run")
    kinds = [e["kind"] for e in evs if e["kind"] in ("eval", "checkpoint")]
    assert sorted(kinds[:2]) == ["checkpoint", "eval"]


def test_disabled_guard_leaves_training_alone(tmp_path: Path) -> None:
    """TRAINGUARD_DISABLE=1: the adapter gets a NullGuard and the library trains to its end."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINGUARD_")}
    env.update(offline_env(tmp_path), TRAINGUARD_DISABLE="1")
    proc = subprocess.run([ultralytics_python(), str(SCRIPT), "--epochs", "2"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=180)
    # 122: completed with error findings (exitcodes.HEALTH), the default since issue 33
    assert proc.returncode in (0, 122) and "Training complete" in proc.stdout, proc.stderr[-3000:]
    assert (tmp_path / "runs" / "train" / "weights" / "last.pt").exists()
    assert not (tmp_path / "trainguard-runs").exists()
