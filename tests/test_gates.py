"""Verdicts that gate: `health` beside `state` wherever the state is shown, `--fail-on` and `--stop-on` for
orchestrators, a final NaN shown as NaN (real `trainguard run` subprocesses on real torch scripts).

Run: pytest tests/test_gates.py
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest
from tgtest import run_trainguard

# planned 100 steps, the LR schedule over after 20 (TG101, an error); the loss turns NaN at the last step
SCRIPT = textwrap.dedent('''
    import torch, trainguard
    torch.manual_seed(0); torch.set_num_threads(1)
    model = torch.nn.Linear(8, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: max(0.0, 1 - s / 20) if ZERO else 1.0)
    guard = trainguard.watch(model, opt, sched, total_steps=100)
    x, y = torch.randn(256, 8), torch.randint(4, (256,))
    for step in range(1, 101):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward(); opt.step(); sched.step(); opt.zero_grad()
        guard.step(loss * float("nan") if NAN_AT_END and step == 100 else loss)
    guard.finish()
''')


def _script(tmp_path: Path, *, zero: bool, nan_at_end: bool) -> Path:
    path = tmp_path / "train.py"
    path.write_text(f"ZERO = {zero}\nNAN_AT_END = {nan_at_end}\n" + SCRIPT)
    return path


@pytest.fixture(scope="module")
def lr_zero_nan_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    base = tmp_path_factory.mktemp("gates")
    script = _script(base, zero=True, nan_at_end=True)
    proc = run_trainguard("run", "--quiet", "--run-dir", str(base / "run"), "--",
                          sys.executable, str(script), cwd=base)
    return base / "run", proc


def test_a_completed_run_with_errors_is_not_healthy_anywhere(lr_zero_nan_run: tuple[Path, object]) -> None:
    run_dir, proc = lr_zero_nan_run
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "completed" and status["health"] == "error", status
    assert any(f["name"] == "lr-reaches-zero" for f in status["findings"])
    assert proc.returncode == 122, proc.stderr  # by default (--fail-on error): completed, but not healthy
    assert "exit 122" in proc.stderr and "health error" in proc.stderr
    shown = run_trainguard("status", str(run_dir))
    assert shown.returncode == 0 and ": completed, step 100/100; health error (" in shown.stdout, shown.stdout
    listed = run_trainguard("ls", "--root", str(run_dir.parent))
    assert "completed" in listed.stdout and "error" in listed.stdout
    md = (run_dir / "report.md").read_text()
    assert "**health: error**" in md
    page = (run_dir / "report.html").read_text()
    assert 'class="badge state" style="background:#2ca02c"' not in page  # no green badge with errors
    assert "health: error" in page


def test_the_report_shows_a_final_nan_as_nan(lr_zero_nan_run: tuple[Path, object]) -> None:
    run_dir, _ = lr_zero_nan_run
    md = (run_dir / "report.md").read_text()
    loss_row = next(line for line in md.splitlines() if line.startswith("| loss |"))
    assert "last nan at step 100" in loss_row and "the last finite value" in loss_row, loss_row


def test_fail_on_never_gives_the_commands_own_exit_code(tmp_path: Path) -> None:
    script = _script(tmp_path, zero=True, nan_at_end=False)
    proc = run_trainguard("run", "--quiet", "--fail-on", "never", "--run-dir", str(tmp_path / "run"), "--",
                          sys.executable, str(script), cwd=tmp_path)
    status = json.loads((tmp_path / "run" / "status.json").read_text())
    assert (proc.returncode, status["state"], status["health"]) == (0, "completed", "error"), proc.stderr


def test_a_healthy_run_is_ok_and_fail_on_passes_it(tmp_path: Path) -> None:
    script = _script(tmp_path, zero=False, nan_at_end=False)
    proc = run_trainguard("run", "--quiet", "--fail-on", "warning", "--run-dir", str(tmp_path / "run"), "--",
                          sys.executable, str(script), cwd=tmp_path)
    status = json.loads((tmp_path / "run" / "status.json").read_text())
    assert (proc.returncode, status["state"], status["health"]) == (0, "completed", "ok"), status["findings"]
    assert 'class="badge state" style="background:#2ca02c"' in (tmp_path / "run" / "report.html").read_text()


def test_stop_on_takes_a_code(tmp_path: Path) -> None:
    script = _script(tmp_path, zero=True, nan_at_end=False)
    script.write_text(script.read_text().replace("range(1, 101)", "range(1, 401)")
                      .replace("total_steps=100", "total_steps=400")
                      .replace("guard.step(loss", "__import__('time').sleep(0.02); guard.step(loss"))
    proc = run_trainguard("run", "--quiet", "--stop-on", "TG101", "--run-dir", str(tmp_path / "run"), "--",
                          sys.executable, str(script), cwd=tmp_path)
    assert proc.returncode == 125, proc.stderr
    assert "stopping the run on lr-reaches-zero" in proc.stderr


@pytest.mark.parametrize("value", ["TG999", "lr-reaches-zeroo", "TG101,nonsense"])
def test_stop_on_refuses_unknown_rules(tmp_path: Path, value: str) -> None:
    proc = run_trainguard("run", "--stop-on", value, "--run-dir", str(tmp_path / "run"), "--",
                          sys.executable, "-c", "print('never runs')", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "unknown rule" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and "never runs" not in proc.stdout
    assert not (tmp_path / "run" / "status.json").exists()


def test_health_is_derived_for_old_status_files(tmp_path: Path) -> None:
    from trainguard.store.status import health_of, read_status

    (tmp_path / "status.json").write_text(json.dumps({"state": "completed", "findings": [
        {"code": "TG301", "name": "nonfinite-loss", "severity": "warning"}]}))
    assert read_status(tmp_path)["health"] == "warning"
    assert health_of({"state": "crashed", "findings": []}) == "error"
    assert health_of({"state": "completed", "findings": []}) == "ok"


def test_ls_shows_errors_and_warnings_apart(tmp_path: Path) -> None:
    # the findings column was one number (errors only): a run with warnings alone read as clean
    from trainguard.store.status import write_status

    def finding(code: str, severity: str) -> dict:
        return {"code": code, "name": f"rule-{code}", "severity": severity, "summary": "s", "evidence": {}}

    for name in ("mixed", "warned", "clean"):
        (tmp_path / name).mkdir()

    write_status(tmp_path / "mixed", {"state": "completed", "step": 10, "command": ["python", "a.py"], "findings": [
        finding("TG101", "error"), finding("TG102", "error"), finding("TG201", "warning"),
        finding("TG202", "warning"), finding("TG203", "info")]})
    write_status(tmp_path / "warned", {"state": "completed", "step": 10, "command": ["python", "b.py"],
                                       "findings": [finding("TG201", "warning")]})
    write_status(tmp_path / "clean", {"state": "completed", "step": 10, "command": ["python", "c.py"], "findings": []})
    listed = run_trainguard("ls", "--root", str(tmp_path))
    assert listed.returncode == 0, listed.stderr
    rows = {line.split()[0]: line for line in listed.stdout.splitlines()[1:]}
    assert " 2E 2W " in rows["mixed"], listed.stdout
    assert " 1W " in rows["warned"] and "E " not in rows["warned"].split("warning")[-1], listed.stdout
    assert "W " not in rows["clean"] and " 0" not in rows["clean"].split("completed")[-1][:20], listed.stdout
