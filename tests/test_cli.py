"""The CLI on bad input (one line, non-zero, never a traceback) and on real runs."""

from __future__ import annotations

import json
from pathlib import Path

from tgtest import run_trainguard


def _one_line_error(out) -> None:
    assert out.returncode == 2, (out.returncode, out.stdout, out.stderr)
    assert "Traceback" not in out.stderr + out.stdout
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("trainguard: error:"), out.stderr


def test_unknown_run(workdir: Path) -> None:
    _one_line_error(run_trainguard("status", "no-such-run", cwd=workdir))


def test_command_that_does_not_exist(workdir: Path) -> None:
    _one_line_error(run_trainguard("run", "--", "definitely-not-a-command-xyz", cwd=workdir))
    _one_line_error(run_trainguard("run", "--", "./missing.sh", cwd=workdir))


def test_unwritable_run_directory(workdir: Path) -> None:
    blocker = workdir / "afile"
    blocker.write_text("a file where a folder should be")
    _one_line_error(run_trainguard("run", "--run-dir", str(blocker / "run"), "--", "true", cwd=workdir))
    _one_line_error(run_trainguard("run", "--run-dir", "/proc/trainguard-run", "--", "true", cwd=workdir))


def test_bad_stall_timeout_and_unknown_rule(workdir: Path) -> None:
    _one_line_error(run_trainguard("run", "--stall-timeout", "-3", "--", "true", cwd=workdir))
    _one_line_error(run_trainguard("rules", "TG999", cwd=workdir))


def test_exit_code_passthrough_and_status(workdir: Path) -> None:
    out = run_trainguard("run", "--run-dir", "r", "--", "sh", "-c", "echo hello; exit 3", cwd=workdir)
    assert out.returncode == 3
    assert "hello" in out.stdout
    st = json.loads((workdir / "r" / "status.json").read_text())
    assert st["state"] == "crashed" and st["exit_code"] == 3
    assert (workdir / "r" / "output.log").read_text() == "hello\n"
    shown = run_trainguard("status", "r", cwd=workdir)
    assert shown.returncode == 0 and "crashed (exit code 3)" in shown.stdout
    listed = run_trainguard("ls", "--root", ".", cwd=workdir)
    assert listed.returncode == 0 and "crashed" in listed.stdout


def test_uninstrumented_success_is_completed(workdir: Path) -> None:
    out = run_trainguard("run", "--run-dir", "ok", "--expect", "out.txt", "--", "sh", "-c", "echo x > out.txt",
                         cwd=workdir)
    assert out.returncode == 0, out.stderr
    assert json.loads((workdir / "ok" / "status.json").read_text())["state"] == "completed"


def test_rules_catalogue_pages(workdir: Path) -> None:
    listing = run_trainguard("rules", cwd=workdir)
    assert listing.returncode == 0 and "TG501" in listing.stdout and "run-hung" in listing.stdout
    page = run_trainguard("rules", "run-crashed", cwd=workdir)
    assert page.returncode == 0
    assert "What it detects" in page.stdout and "What to change" in page.stdout
    as_json = json.loads(run_trainguard("rules", "TG504", "--json", cwd=workdir).stdout)
    assert as_json["name"] == "artifact-missing" and as_json["family"] == "process, hang and data"
