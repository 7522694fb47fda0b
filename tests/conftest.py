"""Shared test helpers. Tests use real torch, real subprocesses, real signals and real SQLite."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scenarios"))


def trainguard_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "trainguard.cli", *args]


def run_trainguard(*args: str, cwd: Path | None = None, timeout: float = 120, env: dict | None = None
                   ) -> subprocess.CompletedProcess:
    full_env = dict(os.environ)
    full_env.pop("TRAINGUARD_RUN_DIR", None)
    if env:
        full_env.update(env)
    return subprocess.run(trainguard_cmd(*args), cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env=full_env)


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TRAINGUARD_RUN_DIR", raising=False)
    monkeypatch.setenv("TRAINGUARD_RUNS_ROOT", str(tmp_path / "trainguard-runs"))
    return tmp_path
