"""The config is checked before anything loads: one-line errors naming the dotted key; CLI exits 2."""

from __future__ import annotations

import subprocess
import sys

import pytest
from click.testing import CliRunner

from trainguard.errors import UserError
from trainguard.recipes.distill.command import distill_command


@pytest.mark.parametrize("over, needle", [
    ({"loss__kd__topk": 5}, "unknown key loss.kd.topk"),
    ({"train__max_steps": "100"}, "train.max_steps must be an integer"),
    ({"optim__lr": "1e-3"}, "write 1.0e-3"),
    ({"loss__lm": 0.0}, "loss.lm must be > 0"),
    ({"train__patience": 1, "train__eval_every": 1}, "shorter than the curriculum's ramp"),
    ({"precision": "fp16"}, "fp16 needs device cuda"),
    ({"teacher__path": "/x"}, "exactly one of teacher.path and teacher.arch"),
    ({"loss__kd__ramp": [0.5, 0.2]}, "loss.kd.ramp"),
    ({"optim__warmup_steps": 8}, "optim.warmup_steps"),
    ({"student__build": {"vocab_size": 9}}, "student.build.vocab_size comes from the tokenizer"),
])
def test_bad_config_is_one_line_user_error(make_cfg, over, needle):
    with pytest.raises(UserError) as info:
        make_cfg(**over)
    msg = str(info.value)
    assert needle in msg and "\n" not in msg


def test_default_dataclasses_are_valid(make_cfg):
    cfg = make_cfg()
    assert cfg.loss.lm > 0 and cfg.loss.kd.top_k == 64


@pytest.mark.parametrize("content, needle", [
    (None, "no such file"),
    ("train: [unclosed\n", "not valid YAML"),
    ("bogus: 1\n", "unknown key bogus"),
    ("train: {max_steps: 1.5}\n", "train.max_steps must be an integer"),
    ("teacher: {arch: qwen2}\nstudent: {arch: llama}\nloss: {kd: {method: uld, renormalize: true}}\n",
     "renormalize applies to method kl only"),
])
def test_cli_bad_input_exits_2_with_one_line(tmp_path, content, needle):
    path = tmp_path / "c.yaml"
    if content is not None:
        path.write_text(content)
    result = CliRunner().invoke(distill_command, [str(path)])
    assert result.exit_code == 2, result.output
    err = result.stderr.strip()
    assert needle in err and len(err.splitlines()) == 1 and "Traceback" not in result.output


def test_config_check_imports_neither_torch_nor_transformers():
    code = ("import sys, trainguard, trainguard.recipes.distill.command as c; "
            "from trainguard.recipes.distill.config import load_config; "
            "from trainguard.recipes.distill import BUNDLED_CONFIG; load_config(BUNDLED_CONFIG); "
            "print('torch' in sys.modules, 'transformers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_cli_runs_the_bundled_config_end_to_end_without_warnings(tmp_path):
    import json
    import warnings

    from trainguard.store.reader import RunReader

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning from the recipe, torch or transformers fails the test
        result = CliRunner().invoke(distill_command, ["bundled", "--max-steps", "6", "--run-dir", str(tmp_path),
                                                      "--json"])
    assert result.exit_code == 0, result.output
    assert result.stderr == ""
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["step"] == 6 and out["evals"][-1]["step"] == 6
    with RunReader(tmp_path) as reader:
        assert reader.status()["state"] == "completed" and reader.findings() == []


def test_cli_missing_teacher_folder_is_a_user_error(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"teacher: {{path: {tmp_path / 'nope'}}}\nstudent: {{arch: llama}}\n")
    result = CliRunner().invoke(distill_command, [str(cfg), "--run-dir", str(tmp_path / "run")])
    assert result.exit_code == 2 and "teacher" in result.stderr and "Traceback" not in result.output
