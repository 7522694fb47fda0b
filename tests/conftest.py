"""Shared fixtures. Tests use real torch, real subprocesses, real signals and real SQLite."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tgtest  # noqa: E402,F401  (puts scenarios/ on sys.path for `import zoo`)


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TRAINGUARD_RUN_DIR", raising=False)
    monkeypatch.setenv("TRAINGUARD_RUNS_ROOT", str(tmp_path / "trainguard-runs"))
    return tmp_path


@pytest.fixture(autouse=True)
def _no_guard_outlives_its_test():
    """Tests share worker processes: a guard a test leaves unfinished (on purpose, to test a crash or a
    switched-off guard) would still be this process's guard, and the next test's `watch()` is refused by
    design (one guard per process, issue 13). Each test starts with no guard watching."""
    yield
    guard_module = sys.modules.get("trainguard.probe.guard")
    if guard_module is None:
        return
    for _ in range(10):
        guard = guard_module.active_guard()
        if guard is None:
            break
        try:
            guard.finish()
        except Exception:
            guard._disabled = True  # finish() failed: at least stop it counting as the process's guard
