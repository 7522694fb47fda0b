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
