"""Issue 36: the defects a new user met with the distillation recipe, each closed and held here.

Real files, real CLI subprocesses where the behaviour is the CLI's, tiny random-init models on the CPU.
"""

from __future__ import annotations

import copy
import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from trainguard.recipes.distill.cache_build import build_cache
from trainguard.recipes.distill.config import parse_config

pytestmark = pytest.mark.process

CLI = [sys.executable, "-m", "trainguard.recipes.distill"]
LOCK_NAME = ".build.lock"  # cache_lock.LOCK_NAME, named here as a user finds it in the folder


def cli(*args: str, cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd)


def one_line_exit_2(proc: subprocess.CompletedProcess, *needles: str) -> str:
    """The CLI's contract for bad input: exit 2, one line on stderr naming the problem, no traceback."""
    err = proc.stderr.strip()
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-2000:], err[-2000:])
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, err
    return err


def cache_dict(base_dict: dict, **data: object) -> dict:
    """A student config that trains from a teacher cache (hidden loss off: the cache holds no hidden states)."""
    d = copy.deepcopy(base_dict)
    d["data"].update(window_chars=160, **data)
    d["loss"]["hidden"].update(start=0.0, end=0.0)
    d["loss"]["kd"]["top_k"] = 16
    d["train"].update(max_steps=4, eval_every=4, save_every=4, log_every=2)
    return d


def write_yaml(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture(scope="module")
def small_cache(base_dict, tmp_path_factory):
    """A cache of the first 30 of the text's windows (--max-windows 30), built through the CLI."""
    root = tmp_path_factory.mktemp("nu")
    config = write_yaml(root / "build.yaml", cache_dict(base_dict))
    proc = cli("cache", "build", str(config), "--out", str(root / "cache"), "--k", "32", "--shard-windows", "16",
               "--max-windows", "30", "--run-dir", str(root / "build-run"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root, root / "cache"


@pytest.fixture(scope="module")
def cache_student(base_dict, small_cache):
    """A student trained from that cache by the CLI, in a runs root `trainguard ls` reads; its teacher section
    differs from the cache's (another initializer_range), and the cache path is relative to the YAML."""
    root, folder = small_cache
    d = cache_dict(base_dict, teacher_cache="cache")
    d["teacher"]["build"]["initializer_range"] = 0.05
    config = write_yaml(root / "student.yaml", d)
    run_dir = root / "runs" / "student"
    proc = cli(str(config), "--run-dir", str(run_dir), "--json", cwd=Path("/"))  # a cwd where "cache" is not
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root, run_dir, proc


# -- 1a: a cache built with --max-windows -------------------------------------------------------------

def test_max_windows_cache_says_it_holds_n_of_m_windows(small_cache):
    root, folder = small_cache
    assert (root / "build-run" / "report.md").is_file()  # the build is a run: its report like any other
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["n_windows"] == 30 and manifest["windows_in_text"] > 30
    proc = cli("cache", "info", str(folder))
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["complete"] is True and info["partial_by_request"] is True
    assert f"holds 30 of the text's {manifest['windows_in_text']} windows" in info["state"]


def test_a_student_trains_on_the_windows_a_max_windows_cache_holds(cache_student):
    _, _, proc = cache_student
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["step"] == 4 and all(x == x for x in result["losses"])
    assert "holds 30 of the text's" in proc.stdout and "training on those 30" in proc.stdout


# -- 1b: resume keeps the guard's step count ------------------------------------------------------------

def test_resume_keeps_the_guards_step_count(make_cfg, tmp_path):
    from trainguard.recipes.distill.train import train
    from trainguard.store.reader import RunReader

    cfg = make_cfg(train__max_steps=6, train__eval_every=3, train__save_every=100)
    first = train(cfg, run_dir=tmp_path / "cut", stop_after=3, verbose=False)
    rest = train(cfg, run_dir=tmp_path / "resumed", resume=first["last"], verbose=False)
    status = json.loads((tmp_path / "resumed" / "status.json").read_text())
    assert rest["step"] == 6 and status["step"] == 6, status["step"]  # was 3: counted from zero again
    with RunReader(tmp_path / "cut") as r1, RunReader(tmp_path / "resumed") as r2:
        cut = [row["step"] for row in r1.steps()]
        resumed = [row["step"] for row in r2.steps()]
    assert len(cut) == len(resumed) == 3 and resumed[0] == cut[-1] + 1, (cut, resumed)


# -- 1c: teacher_cache resolves against the YAML's folder; a missing one names the resolved path ----------

def test_a_missing_teacher_cache_names_the_resolved_path(base_dict, tmp_path):
    config = write_yaml(tmp_path / "s.yaml", cache_dict(base_dict, teacher_cache="no-such-cache"))
    proc = cli(str(config), "--run-dir", str(tmp_path / "run"), cwd=Path("/"))
    one_line_exit_2(proc, f"no cache folder at {(tmp_path / 'no-such-cache').resolve()}", "YAML file's folder")


def test_the_annotated_tiny_yaml_shows_the_cache_routing_and_balance_keys():
    from trainguard.recipes.distill import BUNDLED_CONFIG

    text = BUNDLED_CONFIG.read_text()
    for key in ("teacher_cache:", "routing:", "balance:"):
        assert key in text, key
    parse_config(yaml.safe_load(text))  # still a valid config as shipped


# -- 1d: unchecked inputs -------------------------------------------------------------------------------

def test_verify_with_zero_shards_is_refused(small_cache):
    root, folder = small_cache
    one_line_exit_2(cli("cache", "verify", str(folder), str(root / "build.yaml"), "--shards", "0"), "--shards")


def test_max_windows_zero_is_refused(small_cache, tmp_path):
    root, _ = small_cache
    one_line_exit_2(cli("cache", "build", str(root / "build.yaml"), "--out", str(tmp_path / "c"), "--max-windows", "0"),
                    "--max-windows must be >= 1")


def test_info_says_what_an_unfinished_cache_has_done_and_misses(base_dict, tmp_path):
    cfg = parse_config(cache_dict(base_dict))
    build_cache(cfg, tmp_path / "c", k=32, shard_windows=16, max_windows=40, stop_after_shards=1,
                run_dir=str(tmp_path / "run"), verbose=False)
    proc = cli("cache", "info", str(tmp_path / "c"))
    info = json.loads(proc.stdout)
    assert info["complete"] is False and info["shards_done"] == 1 and info["shards_missing"] == [1, 2]
    assert info["windows_done"] == 16 and info["windows_missing"] == 24
    assert info["state"].startswith("unfinished: 1 of 3 shards (16 of 40 windows)")


def test_an_empty_teacher_cache_is_refused_not_trained_online(base_dict, tmp_path):
    config = write_yaml(tmp_path / "s.yaml", cache_dict(base_dict, teacher_cache=""))
    one_line_exit_2(cli(str(config), "--run-dir", str(tmp_path / "run")), "data.teacher_cache is empty")
    assert not (tmp_path / "run").exists()  # refused before anything ran


def test_a_cache_students_other_teacher_section_is_said(cache_student):
    _, _, proc = cache_student
    warned = [line for line in proc.stderr.splitlines() if "warning: teacher.build differs" in line]
    assert len(warned) == 1 and "teacher section is not used" in warned[0], proc.stderr[-2000:]


def test_a_second_build_into_a_locked_folder_is_refused_with_the_holders_pid(small_cache, tmp_path):
    root, _ = small_cache
    folder = tmp_path / "c"
    folder.mkdir()
    # the holder: this process, as a running build holds it (flock, its PID written in the file)
    fd = os.open(folder / LOCK_NAME, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.write(fd, f"{os.getpid()}\n".encode())
        proc = cli("cache", "build", str(root / "build.yaml"), "--out", str(folder))
        one_line_exit_2(proc, f"another build (PID {os.getpid()}) is writing {folder}")
        assert not (folder / "manifest.json").exists()
    finally:
        os.close(fd)


# -- 1e: cosmetic ---------------------------------------------------------------------------------------

def test_the_header_names_the_cache_not_nonetype(cache_student):
    _, _, proc = cache_student
    header = next(line for line in proc.stdout.splitlines() if line.startswith("teacher ") and " | student " in line)
    assert "NoneType" not in header and "from the cache" in header


def test_an_unknown_arch_is_one_short_line_with_the_valid_choices(base_dict, tmp_path):
    d = copy.deepcopy(base_dict)
    d["student"]["arch"] = "lama"
    err = one_line_exit_2(cli(write_yaml(tmp_path / "s.yaml", d).as_posix(), "--run-dir", str(tmp_path / "r")),
                          "student.arch: 'lama'", "closest: llama")
    assert len(err) < 400, len(err)  # was 11,970 characters


def test_a_distill_run_is_an_ordinary_run_listed_with_its_report(cache_student):
    root, run_dir, _ = cache_student
    assert (run_dir / "report.md").is_file() and (run_dir / "report.html").is_file()
    status = json.loads((run_dir / "status.json").read_text())
    assert status["started"] > 0 and "student.yaml" in " ".join(status["command"])
    ls = subprocess.run([sys.executable, "-m", "trainguard", "ls", "--root", str(root / "runs")],
                        capture_output=True, text=True, timeout=120)
    assert ls.returncode == 0, ls.stderr
    row = next(line for line in ls.stdout.splitlines() if line.startswith("student "))
    assert "completed" in row and "student.yaml" in row and " 4 " in row, ls.stdout


def test_cache_students_eval_reports_kd_topk(cache_student):
    _, _, proc = cache_student
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "kd_topk" in result["evals"][-1], result["evals"][-1]


# -- 2: recipe inputs validated like the rest of the CLI ----------------------------------------------------

@pytest.mark.parametrize("args, needle", [
    (["cache", "build", "{cfg}", "--out", "{tmp}/c", "--k", "0"], "--k must be >= 1"),
    (["cache", "build", "{cfg}", "--out", "{tmp}/c", "--shard-windows", "-1"], "--shard-windows must be >= 1"),
    (["cache", "info", "{tmp}/nothing"], "is not a folder"),
    (["{tmp}/nothing.yaml"], "no such file"),
    (["{cfg}", "--resume", "{tmp}/nothing.pt"], "nothing.pt"),
    (["{cfg}", "--run-dir", "{cfg}/run"], "is not a folder"),  # was exit 70 after the guard declined it
    (["cache", "build", "{cfg}", "--out", "{tmp}/c", "--run-dir", "{cfg}"], "is not a folder"),
])
def test_bad_recipe_input_is_one_line_exit_2(small_cache, tmp_path, args, needle):
    root, _ = small_cache
    filled = [a.format(cfg=root / "build.yaml", tmp=tmp_path) for a in args]
    one_line_exit_2(cli(*filled), needle)


def test_a_damaged_manifest_met_by_a_build_is_one_line_exit_2(small_cache, tmp_path):
    root, _ = small_cache
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "manifest.json").write_text('{"format": 2, "k": ')  # cut short
    one_line_exit_2(cli("cache", "build", str(root / "build.yaml"), "--out", str(tmp_path / "c")),
                    "manifest.json is not valid JSON")


def test_a_training_text_that_is_not_utf8_is_one_line_exit_2(base_dict, tmp_path):
    (tmp_path / "train.bin").write_bytes(b"hello \xff\xfe world")
    d = copy.deepcopy(base_dict)
    d["data"]["train"] = "train.bin"  # relative: against the YAML's folder
    one_line_exit_2(cli(write_yaml(tmp_path / "s.yaml", d).as_posix(), "--run-dir", str(tmp_path / "r")),
                    "train.bin is not UTF-8 text")


def test_verify_recomputes_the_eval_windows_targets_too(small_cache):
    root, folder = small_cache
    proc = cli("cache", "verify", str(folder), str(root / "build.yaml"), "--shards", "1")
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["ok"] is True and out["eval_windows_checked"] == 8, out
