"""Shared fixtures. Tests use real torch, real subprocesses, real signals and real SQLite."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tgtest  # noqa: E402,F401  (puts scenarios/ on sys.path for `import zoo`)

# The tiers (`pytest -m unit`, `-m "not slow"`, ...; registered in pyproject.toml). A module says its own
# with `pytestmark = pytest.mark.<tier>`; the modules written before the tiers existed are listed here.
# unit: no subprocess, no training, fast (what `./dev check` runs); process: real subprocesses, real
# training; slow: over half a minute; gpu: needs a CUDA device (skipped without one).
TIERS = {
    "unit": {"test_architecture", "test_log_formats", "test_parts_imbalanced", "test_pacing", "test_check",
             "test_hostile_input", "test_memory_rules", "test_real_logs"},
    "gpu": {"test_probe_gpu", "test_hang_gpu", "test_values_in_place"},
    "slow": {"test_zoo", "test_fuzz", "test_faults"},
}
TIER_NAMES = ("unit", "process", "slow", "gpu", "slurm")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test gets one tier: its own marker, its module's in TIERS, else `process`."""
    for item in items:
        if any(item.get_closest_marker(t) for t in TIER_NAMES):
            continue
        module = item.module.__name__.rsplit(".", 1)[-1] if item.module else ""
        tier = next((t for t, names in TIERS.items() if module in names), "process")
        item.add_marker(getattr(pytest.mark, tier))


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
            guard.state.disabled = True  # finish() failed: at least stop it counting as the process's guard
