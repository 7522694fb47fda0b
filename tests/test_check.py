"""`trainguard check CONFIG`: findings on real config files, --fix proven by re-checking its output, and
bad input as one line with exit 2 (real subprocesses of the CLI).

Run: pytest tests/test_check.py
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from tgtest import ROOT, run_trainguard

from trainguard.preflight.check import check, plan_of
from trainguard.preflight.config import load_config

SEED002 = ROOT / "scenarios" / "check_seed002_config" / "config.json"
SEED004 = ROOT / "scenarios" / "check_seed004_patience" / "config.yaml"


def _last_json(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def test_seed002_schedule_and_warmup(tmp_path: Path) -> None:
    r = run_trainguard("check", "--json", str(SEED002), cwd=tmp_path)
    assert r.returncode == 1, r.stderr
    report = _last_json(r.stdout)
    names = {f["name"]: f for f in report["findings"]}
    assert set(names) == {"max-steps-counts-micro-batches", "schedule-ignores-accumulation", "warmup-exceeds-run"}
    assert report["plan"]["optimizer_steps"] == 4686  # 100000 / 4 = 25000 micro-batches // 16 × 3
    assert "75000" in names["schedule-ignores-accumulation"]["summary"]
    assert names["schedule-ignores-accumulation"]["evidence"]["training.gradient_accumulation_steps"] == 16


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_fix_writes_a_config_that_passes(tmp_path: Path, suffix: str) -> None:
    out = tmp_path / f"fixed{suffix}"
    before = SEED002.read_text()
    r = run_trainguard("check", str(SEED002), "--fix", "--output", str(out), cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert SEED002.read_text() == before  # the input is never touched
    assert "-    \"num_training_steps\": 75000," in r.stdout and "fixed training.num_training_steps" in r.stdout
    again = run_trainguard("check", "--json", str(out), cwd=tmp_path)  # proven independently
    assert again.returncode == 0 and _last_json(again.stdout)["findings"] == []
    data = json.loads(out.read_text()) if suffix == ".json" else yaml.safe_load(out.read_text())
    assert data["training"]["num_training_steps"] == 4686 and data["training"]["warmup_steps"] == 469
    assert data["training"]["max_steps"] == 4686
    assert data["distillation"] == {"temperature": 3.0, "kd_top_k": None}  # the rest is kept as it was


def test_seed002_max_steps_counted_in_micro_batches(tmp_path: Path) -> None:
    # Seed 002's own shape: 3 epochs of 25,000 micro-batches, accumulation 16, max_steps 75,000 (the
    # micro-batch count). Before TG619 this passed as "plan: 75000 optimizer steps (max_steps 75000)".
    cfg = tmp_path / "seed002.yaml"
    cfg.write_text("training:\n  num_train_epochs: 3\n  per_device_train_batch_size: 4\n"
                   "  gradient_accumulation_steps: 16\n  max_steps: 75000\n  warmup_steps: 1000\n"
                   "  lr_scheduler_type: cosine\n  learning_rate: 3.0e-5\ndataset_size: 100000\n")
    r = run_trainguard("check", "--json", str(cfg), cwd=tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    report = _last_json(r.stdout)
    assert [f["name"] for f in report["findings"]] == ["max-steps-counts-micro-batches"]
    f = report["findings"][0]
    # the arithmetic is in the finding: 25000 per epoch x 3 = 75000 micro-batches; 1562 x 3 = 4686 steps
    assert "25000 per epoch × 3" in f["summary"] and "1562 × 3 = 4686 optimizer steps" in f["summary"]
    assert f["evidence"]["training.max_steps"] == 75000 and f["evidence"]["micro_batches"] == 75000
    assert report["plan"]["optimizer_steps"] == 4686 and report["health"] == "error"
    out = tmp_path / "fixed.yaml"
    r = run_trainguard("check", str(cfg), "--fix", "--output", str(out), cwd=tmp_path)
    assert r.returncode == 0 and "fixed training.max_steps: 75000 -> 4686" in r.stdout, r.stdout
    assert yaml.safe_load(out.read_text())["training"]["max_steps"] == 4686
    # the same max_steps without accumulation counts optimizer steps: nothing to say
    cfg.write_text(cfg.read_text().replace("gradient_accumulation_steps: 16", "gradient_accumulation_steps: 1"))
    _, findings = check(load_config(cfg))
    assert "max-steps-counts-micro-batches" not in {x.name for x in findings}


def test_seed004_patience_shorter_than_curriculum_and_fix(tmp_path: Path) -> None:
    cfg = load_config(SEED004)
    plan, findings = check(cfg)
    pat = next(f for f in findings if f.name == "patience-too-short")
    assert pat.severity == "error" and pat.cause == "shorter-than-curriculum"
    assert pat.evidence["curriculum_ramp_steps"] == round(0.5 * plan.optimizer_steps)
    assert any(f.name == "interval-exceeds-run" and "save" in f.summary for f in findings)
    out = tmp_path / "fixed.yaml"
    r = run_trainguard("check", str(SEED004), "--fix", "--output", str(out), cwd=tmp_path)
    assert r.returncode == 0, r.stdout
    fixed = yaml.safe_load(out.read_text())["training"]
    assert fixed["early_stopping_patience"] * fixed["eval_steps"] >= round(0.5 * plan.optimizer_steps)
    assert fixed["save_steps"] <= plan.optimizer_steps


def test_plan_follows_hugging_face(tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text("num_train_epochs: 2\nper_device_train_batch_size: 8\ngradient_accumulation_steps: 3\n")
    plan = plan_of(load_config(p, dataset_size=1001))
    # HF: len(dataloader) = ceil(1001 / 8) = 126; update steps per epoch = 126 // 3 = 42; × 2 epochs
    assert (plan.micro_per_epoch, plan.steps_per_epoch, plan.optimizer_steps) == (126, 42, 84)
    p.write_text("max_steps: 500\nnum_train_epochs: 2\n")
    assert plan_of(load_config(p)).optimizer_steps == 500
    # eval_steps below 1 is a share of the run; warmup_steps 0 leaves warmup_ratio in charge
    p.write_text("max_steps: 500\neval_steps: 0.1\nwarmup_steps: 0\nwarmup_ratio: 0.8\n")
    _, findings = check(load_config(p))
    assert [f.name for f in findings] == ["warmup-exceeds-run"] and findings[0].evidence["warmup_steps"] == 400


@pytest.mark.parametrize("line, name, severity", [
    ("learning_rate: 3.0", "implausible-value", "error"),
    ("learning_rate: 0", "implausible-value", "error"),
    ("temperature: -1", "implausible-value", "error"),
    ("temperature: 50", "implausible-value", "warning"),
    ("kd_top_k: 0", "implausible-value", "error"),
    ("eval_steps: 2", "interval-dominates-run", "warning"),
    ("warmup_ratio: 0.7", "warmup-exceeds-run", "warning"),
    ("num_training_steps: 100", "schedule-length-mismatch", "error"),
    ("num_training_steps: 1000", "schedule-length-mismatch", "warning"),
    ("lr_scheduler_type: constant\nwarmup_steps: 20", "warmup-ignored", "warning"),
])
def test_single_problems(tmp_path: Path, line: str, name: str, severity: str) -> None:
    p = tmp_path / "c.yaml"
    p.write_text(f"max_steps: 400\n{line}\n")
    _, findings = check(load_config(p))
    assert [(f.name, f.severity) for f in findings] == [(name, severity)]


def test_healthy_config_is_quiet() -> None:
    _, findings = check(load_config(ROOT / "scenarios" / "check_healthy_config" / "config.yaml"))
    assert findings == []


@pytest.mark.parametrize("name, text, message", [
    ("missing.yaml", None, "config not found"),
    ("bad.yaml", "training:\n  lr: [1, 2\n", "malformed YAML at line"),
    ("bad.json", '{"lr": 1e-3,}', "malformed JSON"),
    ("list.yaml", "- 1\n- 2\n", "must be a mapping"),
    ("type.yaml", "training:\n  num_train_epochs: three\n", "training.num_train_epochs: expected a number"),
    ("int.yaml", "gradient_accumulation_steps: 2.5\n", "expected an integer"),
    ("sched.yaml", "lr_scheduler_type: cosine_annealing_with_magic\n", "unknown scheduler"),
])
def test_bad_input_is_one_line_exit_2(tmp_path: Path, name: str, text: str | None, message: str) -> None:
    if text is not None:
        (tmp_path / name).write_text(text)
    r = run_trainguard("check", name, cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and message in r.stderr and "Traceback" not in r.stderr


def test_fix_switches_a_constant_schedule_with_warmup(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("max_steps: 400\nlr_scheduler_type: constant\nwarmup_ratio: 0.05\n")
    r = run_trainguard("check", str(cfg), "--fix", "--output", str(tmp_path / "f.yaml"), cwd=tmp_path)
    assert r.returncode == 0 and "fixed lr_scheduler_type: 'constant' -> 'constant_with_warmup'" in r.stdout
    assert yaml.safe_load((tmp_path / "f.yaml").read_text())["lr_scheduler_type"] == "constant_with_warmup"


def test_fix_needs_an_output_other_than_the_input(tmp_path: Path) -> None:
    cfg = tmp_path / "c.json"
    cfg.write_text(SEED002.read_text())
    for args in (["--fix"], ["--fix", "--output", str(cfg)]):
        r = run_trainguard("check", str(cfg), *args, cwd=tmp_path)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert cfg.read_text() == SEED002.read_text()


def test_configuration_rules_have_full_pages() -> None:
    from trainguard.catalog import CATALOG

    sections = ("## What it detects", "## Why it matters", "## Example", "## What to change",
                "## Known false positives", "## Options")
    entries = [e for e in CATALOG if e.code.startswith("TG6")]
    assert len(entries) >= 17
    for e in entries:
        doc = e.doc()
        assert all(s in doc for s in sections), e.code
        assert e.headline() and not e.headline().startswith("TG")


@pytest.mark.parametrize(("per_epoch", "accum", "total"), [
    ("batches_per_epoch", "grad_accum", "total_steps"),
    ("steps_per_epoch", "gradient_accumulation_steps", "max_steps"),
    ("iters_per_epoch", "accumulate_grad_batches", "num_training_steps"),
    ("num_batches", "grad_accum", "max_steps"),
    ("micro_batches_per_epoch", "grad_accum", "total_steps"),
])
def test_seed002_in_natural_key_names(tmp_path: Path, per_epoch: str, accum: str, total: str) -> None:
    # Seed 002 as people write it: the epoch's length in batches, not a dataset size. This passed as
    # "no findings" before the epoch-length keys were read.
    cfg = tmp_path / "train.yaml"
    cfg.write_text(f"# seed 002\ntrain:\n  epochs: 3  # three passes\n  {per_epoch}: 25000\n"
                   f"  {accum}: 16  # accumulate\n  {total}: 75000\n  lr: 1.0e-4\n")
    r = run_trainguard("check", "--json", str(cfg), cwd=tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    report = _last_json(r.stdout)
    assert [f["code"] for f in report["findings"]] == ["TG619"]
    assert "25000 per epoch × 3" in report["findings"][0]["summary"]
    assert "1562 × 3 = 4686 optimizer steps" in report["findings"][0]["summary"]
    out = tmp_path / "fixed.yaml"
    r = run_trainguard("check", str(cfg), "--fix", "--output", str(out), cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    fixed = out.read_text()
    assert f"  {total}: 4686\n" in fixed and "# three passes" in fixed and "# accumulate" in fixed


def test_seed002_without_the_epoch_length_says_not_checked(tmp_path: Path) -> None:
    cfg = tmp_path / "train.yaml"
    cfg.write_text("epochs: 3\ngrad_accum: 16\ntotal_steps: 75000\n")
    r = run_trainguard("check", str(cfg), cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "not checked: whether total_steps 75000 counts micro-batches" in r.stdout
    assert "(give --dataset-size" in r.stdout
    r = run_trainguard("check", str(cfg), "--dataset-size", "100000", cwd=tmp_path)
    assert "not checked" in r.stdout  # a dataset size without a batch size still leaves the epoch unknown


def test_numbers_yaml_reads_as_strings_are_numbers(tmp_path: Path) -> None:
    # PyYAML (YAML 1.1) reads `3e-5` and `1e3` as strings; the whole config was refused over it
    cfg = tmp_path / "train.yaml"
    cfg.write_text("learning_rate: 3e-5\nnum_train_epochs: 3\nper_device_train_batch_size: 4\n"
                   "gradient_accumulation_steps: 16\nmax_steps: 75000\nwarmup_steps: 1e3\n")
    assert isinstance(yaml.safe_load(cfg.read_text())["learning_rate"], str)
    r = run_trainguard("check", "--json", str(cfg), "--dataset-size", "100000", cwd=tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr  # checked, and seed 002's TG619 found
    assert [f["code"] for f in _last_json(r.stdout)["findings"]] == ["TG619"]
    loaded = load_config(cfg)
    assert loaded.get("lr") == 3e-5 and loaded.get("warmup_steps") == 1000
    cfg.write_text("learning_rate: 3e-five\n")
    r = run_trainguard("check", str(cfg), cwd=tmp_path)
    assert r.returncode == 2 and "learning_rate: expected a number, got '3e-five'" in r.stderr
