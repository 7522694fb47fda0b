"""The package as a type checker sees it from a user's script: typed (py.typed), `watch()` resolvable.

A real mypy run in a subprocess, outside the project (no project config), on a script written the way
people write a training loop. mypy analyses an installed package only when it carries the py.typed marker,
so this also proves the marker is in place.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from importlib import resources

import pytest

pytest.importorskip("mypy")

USER_SCRIPT = """\
import torch

import trainguard

model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
guard = trainguard.watch(model, optimizer, total_steps=10, run_dir="runs/typed")
reveal_type(guard)
for batch in guard.batches([torch.randn(8, 4) for _ in range(10)]):
    reveal_type(batch)
    loss = model(batch).pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    guard.step(loss)
    if guard.due("eval", every=5):
        with guard.phase("eval"):
            guard.eval(loss=float(loss))
guard.finish()
"""


def test_py_typed_marker_ships():
    assert resources.files("trainguard").joinpath("py.typed").is_file()


def test_watch_return_type_resolves_for_a_user_script(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(USER_SCRIPT)
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-error-summary", "--cache-dir", str(tmp_path / ".mypy_cache"),
         "--config-file", "", "train.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=280,
    )
    out = proc.stdout + proc.stderr
    notes = [line for line in out.splitlines() if "Revealed type" in line]
    assert notes, out
    # The Guard itself, or the do-nothing NullGuard it stands for when watching is off: both real classes
    assert '"trainguard.probe.guard.Guard | trainguard.probe.null.NullGuard"' in notes[0], textwrap.indent(out, "  ")
    # batches() hands the loop what its loader yields, typed
    assert len(notes) == 2 and '"torch._tensor.Tensor"' in notes[1], out
    # the loop's calls type-check on either: no error, no "missing library stubs or py.typed marker"
    assert proc.returncode == 0, out
    assert "error:" not in out, out
