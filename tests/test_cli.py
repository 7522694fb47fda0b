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


def test_leftover_processes_are_reported_and_stopped(workdir: Path) -> None:
    out = run_trainguard("run", "--run-dir", "r", "--", "sh", "-c", "echo main; (sleep 40; echo late) & exit 0",
                         cwd=workdir, timeout=30)
    assert out.returncode == 0, out.stderr
    st = json.loads((workdir / "r" / "status.json").read_text())
    assert st["state"] == "completed"
    assert [f["name"] for f in st["findings"]] == ["leftover-processes"]
    assert "late" not in (workdir / "r" / "output.log").read_text()


def test_garbage_inputs_get_one_line(workdir: Path) -> None:
    (workdir / "bin.yaml").write_bytes(bytes(range(256)) * 8)
    _one_line_error(run_trainguard("check", "bin.yaml", cwd=workdir))
    (workdir / "g").mkdir()
    (workdir / "g" / "run.db").write_bytes(b"\x00garbage" * 300)
    for command in ("report", "diagnose"):
        _one_line_error(run_trainguard(command, "g", cwd=workdir))
    (workdir / "l").mkdir()
    (workdir / "l" / "status.json").write_text("[1, 2]")
    _one_line_error(run_trainguard("status", "l", cwd=workdir))


def test_distill_without_its_extra_is_one_line_and_exit_2(workdir: Path) -> None:
    # The interpreter is told tokenizers cannot be imported (None in sys.modules is how Python itself
    # marks a module as unimportable), as in an environment installed without the distill extra.
    import subprocess
    import sys

    code = "import sys; sys.modules['tokenizers'] = None; from trainguard.cli import main; main()"
    out = subprocess.run([sys.executable, "-c", code, "distill", "bundled"], cwd=workdir, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 2, (out.returncode, out.stderr)
    assert "Traceback" not in out.stderr and "internal error" not in out.stderr
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "pip install 'trainguard[distill]'" in lines[0], out.stderr


def test_a_hung_run_that_was_stopped_reads_back_as_hung(workdir: Path) -> None:
    # `hung` is also the state of a run left alive (--on-hang wait); once stopped it has ended, and a
    # reader must not call it abandoned because its watchdog has exited since.
    import sys

    out = run_trainguard("run", "--run-dir", "h", "--stall-timeout", "2", "--", sys.executable, "-c",
                         "import threading; print('started', flush=True); threading.Event().wait()", cwd=workdir)
    assert out.returncode == 124, out.stderr
    shown = run_trainguard("status", "h", "--json", cwd=workdir)
    assert json.loads(shown.stdout)["state"] == "hung", shown.stdout
