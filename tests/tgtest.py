"""Helpers the tests share (imported by name: a `conftest` import is ambiguous with nested conftest files)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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
