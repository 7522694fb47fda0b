"""The Hugging Face and Lightning adapters with the real libraries: tiny models, CPU, a few dozen steps.

Each run is a real subprocess (tests/integrations/*_train.py) with the callback; the run folder's
status.json says what the probe (and its live rules) found, and `trainguard diagnose` reads the logs the
library itself wrote (trainer_state.json, metrics.csv, TensorBoard files, the captured stdout).

Run: pytest tests/test_integrations.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tgtest import run_trainguard

pytest.importorskip("transformers")
pytest.importorskip("lightning")

HERE = Path(__file__).resolve().parent / "integrations"
# The planted failures are found by the health rules (another issue's engine); without it, skip them.


def train(tmp: Path, script: str, plant: str = "none", env: dict | None = None, *extra: str) -> dict:
    out, run = tmp / "out", tmp / "run"
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINGUARD_")}
    full_env.update(env or {})
    proc = subprocess.run([sys.executable, str(HERE / script), "--out", str(out), "--run-dir", str(run),
                           "--plant", plant, *extra], capture_output=True, text=True, timeout=240,
                          env=full_env, cwd=tmp)
    (tmp / "stdout.log").write_text(proc.stdout + proc.stderr)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    status = json.loads((run / "status.json").read_text())
    return {"out": out, "run": run, "log": tmp / "stdout.log", "status": status,
            "names": [f["name"] for f in status.get("findings") or []]}


def loud(findings: list[dict]) -> list[str]:
    return [f"{f['name']}: {f['summary']}" for f in findings if f.get("severity") in ("warning", "error")]


def diagnose(path: Path) -> dict:
    proc = run_trainguard("diagnose", str(path), "--json")
    assert proc.returncode in (0, 1), proc.stderr
    assert "Traceback" not in proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def hf_runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return {plant: train(tmp_path_factory.mktemp(f"hf-{plant}"), "hf_train.py", plant)
            for plant in ("none", "lr-zero", "nan", "frozen")}


@pytest.fixture(scope="module")
def pl_runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return {plant: train(tmp_path_factory.mktemp(f"pl-{plant}"), "lightning_train.py", plant)
            for plant in ("none", "lr-zero", "nan", "frozen")}


# -- Hugging Face ----------------------------------------------------------------------------------------

def test_hf_healthy_run_is_recorded_and_quiet(hf_runs: dict) -> None:
    r = hf_runs["none"]
    st = r["status"]
    assert st["state"] == "completed" and st["step"] == 40 and st["total_steps"] == 40
    assert loud(st["findings"]) == []
    from trainguard.store.reader import RunReader

    with RunReader(r["run"]) as reader:
        rows = list(reader.steps())
        events = reader.events()
    assert [row["step"] for row in rows] == list(range(1, 41))  # one row per optimizer step
    assert all(row["loss"] is not None and row["lr"] is not None for row in rows)
    assert sum(1 for e in events if e["kind"] == "eval") == 2  # eval_steps=20 of 40
    assert [Path(e["data"]["path"]).name for e in events if e["kind"] == "checkpoint"] == ["checkpoint-20",
                                                                                          "checkpoint-40"]
    phases = {e["name"] for e in events if e["kind"] == "phase"}
    assert {"train", "eval"} <= phases


def test_hf_output_folder_and_stdout_diagnosed_quiet(hf_runs: dict) -> None:
    r = hf_runs["none"]
    d = diagnose(r["out"])
    assert d["format"].startswith("hugging face") and d["state"] == "completed"
    assert d["steps"] == 20 and d["evals"] == 2  # logging_steps=2
    assert loud(d["findings"]) == []
    d = diagnose(r["log"])
    assert d["state"] == "completed" and d["steps"] == 20 and loud(d["findings"]) == []


def test_hf_nan_is_seen_although_the_trainer_filters_it(hf_runs: dict) -> None:
    from trainguard.store.reader import RunReader

    with RunReader(hf_runs["nan"]["run"]) as reader:
        losses = [row["loss"] for row in reader.steps()]
    # micro-batch 30 is the second micro-batch of step 15: from there the probe's loss is NaN
    assert all(v == v for v in losses[:14]) and all(v != v for v in losses[14:])
    state = json.loads((sorted(hf_runs["nan"]["out"].glob("checkpoint-*"))[-1] / "trainer_state.json").read_text())
    logged = [h["loss"] for h in state["log_history"] if "loss" in h]
    assert all(v == v for v in logged)  # the Trainer's own log never shows it


@pytest.mark.parametrize("plant,name", [("lr-zero", "lr-reaches-zero"), ("nan", "nonfinite-loss"),
                                        ("frozen", "weights-not-updating")])
def test_hf_planted_failures_found_by_name(hf_runs: dict, plant: str, name: str) -> None:
    assert name in hf_runs[plant]["names"], hf_runs[plant]["status"]["findings"]


@pytest.mark.parametrize("plant,name", [("lr-zero", "lr-reaches-zero"), ("nan", "nonfinite-grad")])
def test_hf_planted_failures_found_in_trainer_state(hf_runs: dict, plant: str, name: str) -> None:
    # offline the Trainer's NaN-filtered loss hides the NaN; its grad_norm does not
    names = [f["name"] for f in diagnose(hf_runs[plant]["out"])["findings"]]
    assert name in names


def test_hf_under_trainguard_preflight(tmp_path: Path) -> None:
    """`trainguard preflight` on an unmodified Trainer script: eval and save brought forward through the
    Trainer's control flags, the checkpoint resumed from in the second start."""
    proc = run_trainguard("preflight", "--run-dir", str(tmp_path / "pf"), "--", sys.executable,
                          str(HERE / "hf_train.py"), "--out", "out", "--steps", "200", cwd=tmp_path, timeout=240)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    forward = next(line for line in out.splitlines() if "brought forward:" in line)
    assert "eval (every 20, ran at step" in forward and "save (every 20, ran at step" in forward
    assert "checkpoint round trip: ok" in out


def test_hf_resumed_run_continues_its_step_count(tmp_path: Path) -> None:
    """A Trainer resumed from checkpoint-20 (as `trainguard run` restarts it): rows go on from step 21."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = train(tmp_path / "a", "hf_train.py", "none", None, "--steps", "20")
    ckpt = first["out"] / "checkpoint-20"
    second = train(tmp_path / "b", "hf_train.py", "none", {"TRAINGUARD_RESUME_FROM": str(ckpt)}, "--steps", "40")
    from trainguard.store.reader import RunReader

    with RunReader(second["run"]) as reader:
        steps = [row["step"] for row in reader.steps()]
    assert steps == list(range(21, 41)) and loud(second["status"]["findings"]) == []


# -- Lightning -------------------------------------------------------------------------------------------

def test_lightning_healthy_run_is_recorded_and_quiet(pl_runs: dict) -> None:
    r = pl_runs["none"]
    st = r["status"]
    assert st["state"] == "completed" and st["step"] == 40 and st["total_steps"] == 40
    assert loud(st["findings"]) == []
    from trainguard.store.reader import RunReader

    with RunReader(r["run"]) as reader:
        rows = list(reader.steps())
        events = reader.events()
        plan = reader.meta()["plan"]
    assert plan["grad_accum"] == 2 and len(rows) == 40 and rows[-1]["micro"] == 80
    phases = [e["name"] for e in events if e["kind"] == "phase"]
    assert phases[0] == "sanity-check" and "eval" in phases
    assert sum(1 for e in events if e["kind"] == "eval") == 2
    assert any(e["kind"] == "checkpoint" and e["name"].endswith(".ckpt") for e in events)


def test_lightning_metrics_csv_diagnosed_quiet(pl_runs: dict) -> None:
    d = diagnose(pl_runs["none"]["out"])
    assert d["format"] == "lightning metrics.csv" and d["steps"] == 40 and d["evals"] == 2
    assert loud(d["findings"]) == []
    d = diagnose(pl_runs["none"]["log"])
    assert d["state"] == "completed" and loud(d["findings"]) == []


@pytest.mark.parametrize("plant,name", [("lr-zero", "lr-reaches-zero"), ("nan", "nonfinite-loss"),
                                        ("frozen", "weights-not-updating")])
def test_lightning_planted_failures_found_by_name(pl_runs: dict, plant: str, name: str) -> None:
    assert name in pl_runs[plant]["names"], pl_runs[plant]["status"]["findings"]


def test_lightning_under_trainguard_preflight(tmp_path: Path) -> None:
    """Validation is reached by Lightning's own sanity check; preflight brings the checkpoint forward."""
    proc = run_trainguard("preflight", "--run-dir", str(tmp_path / "pf"), "--", sys.executable,
                          str(HERE / "lightning_train.py"), "--out", "out", "--steps", "200", cwd=tmp_path,
                          timeout=240)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "brought forward: save (every 16, ran at step" in out and "checkpoint round trip: ok" in out


def test_lightning_nan_found_in_metrics_csv(pl_runs: dict) -> None:
    names = [f["name"] for f in diagnose(pl_runs["nan"]["out"])["findings"]]
    assert "nonfinite-loss" in names


def test_lightning_tensorboard_files_diagnosed(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    r = train(tmp_path, "lightning_train.py", "none", None, "--logger", "tb", "--steps", "20")
    d = diagnose(r["out"])
    assert d["format"] == "tensorboard event files" and d["steps"] >= 19 and d["evals"] == 1
    assert loud(d["findings"]) == []
