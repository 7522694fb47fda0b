"""The model found without `watch()`: torch's global module hooks under the automatic probe (probe/modulesight.py).

Real interpreters with the bootstrap on PYTHONPATH (as under `trainguard run`), real torch modules and
optimizers. The zoo's *_noprobe mode scenarios run the same through `trainguard run` end to end.
    pytest -q -p no:xdist tests/test_modulesight.py
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from trainguard.probe.auto import bootstrap_env

pytestmark = pytest.mark.process


def _python(code: str, tmp_path: Path, tail: bool = True) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINGUARD_")}
    env.update(bootstrap_env(env))
    env["TRAINGUARD_RUN_DIR"] = str(tmp_path / "run")
    env["TRAINGUARD_WATCHDOG"] = "1"
    script = textwrap.dedent(code) + (textwrap.dedent(TAIL) if tail else "")
    return subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)


def _events(run_dir: Path, kind: str) -> list[tuple[str, dict]]:
    with sqlite3.connect(run_dir / "run.db") as db:
        return [(n, json.loads(d)) for n, d in db.execute("select name, data from events where kind=?", (kind,))]


# the script prints, at its end, whether a global hook of ours is left and where the checks' hook sits
TAIL = """
    from torch.nn.modules import module as M
    from trainguard.probe import auto
    c = auto._state["guard"].contracts
    print(len(M._global_forward_pre_hooks), type(c.module).__name__, len(c.modes.mode_modules))
"""


def test_the_outermost_module_holding_the_optimizers_parameters_is_the_model(tmp_path: Path) -> None:
    # a wrapper around the trained network (as DDP is), a loss module and an EMA copy whose parameters the
    # optimizer does not hold: the wrapper is the model; the global hook is off once the window passed
    r = _python("""
        import copy, torch
        from torch import nn
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.1), nn.Linear(16, 2))
        class Wrapper(nn.Module):
            def __init__(self, m):
                super().__init__(); self.module = m
            def forward(self, x):
                return self.module(x)
        model, ema, crit = Wrapper(net), copy.deepcopy(net), nn.CrossEntropyLoss()
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        for step in range(6):
            x, y = torch.randn(4, 8), torch.randint(2, (4,))
            with torch.no_grad():
                ema(x)  # not trained by this optimizer: never the model
            crit(model(x), y).backward()
            opt.step(); opt.zero_grad()
    """, tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["0", "Wrapper", "1"]
    seen = [d for n, d in _events(tmp_path / "run", "probe") if n == "model-seen"]
    assert [d["model"] for d in seen] == ["Wrapper"] and seen[0]["by"] == "global module hooks"


def test_a_submodule_called_first_gives_way_to_the_module_that_holds_it(tmp_path: Path) -> None:
    r = _python("""
        import torch
        from torch import nn
        class Net(nn.Module):
            def __init__(self):
                super().__init__(); self.body = nn.Linear(8, 8); self.head = nn.Linear(8, 2)
            def forward(self, x):
                return self.head(self.body(x))
        model = Net()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(6):
            x = torch.randn(4, 8)
            model.body(x).sum().mul(0).backward()  # the body alone first (a feature probe)
            model(x).pow(2).mean().backward()
            opt.step(); opt.zero_grad()
    """, tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["0", "Net", "0"]
    seen = [d for n, d in _events(tmp_path / "run", "probe") if n == "model-seen"]
    assert [(d["model"], d["replaced"]) for d in seen] == [("Linear", None), ("Net", "Linear")]


def test_a_forward_raising_inside_the_window_leaves_the_script_as_it_was(tmp_path: Path) -> None:
    # the guard never becomes the failure: the user's own error propagates unchanged, training goes on
    r = _python("""
        import torch
        from torch import nn
        model = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.Linear(8, 2))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        caught = 0
        for step in range(6):
            try:
                model(torch.randn(4, 9))
            except RuntimeError:
                caught += 1
            model(torch.randn(4, 8)).pow(2).mean().backward()
            opt.step(); opt.zero_grad()
        print(caught)
    """, tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["6", "0", "Sequential", "1"]


def test_the_report_counts_the_forward_contracts_as_checked_on_the_model_found(tmp_path: Path) -> None:
    from trainguard.report.checks import build_checks
    from trainguard.report.load import load_run

    r = _python("""
        import torch
        from torch import nn
        model = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.2), nn.Linear(8, 2))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(6):
            model(torch.randn(4, 8)).pow(2).mean().backward()
            opt.step(); opt.zero_grad()
    """, tmp_path, tail=False)
    assert r.returncode == 0, r.stderr
    checks = {c.code: c.result for c in build_checks(load_run(tmp_path / "run"))}
    assert checks["TG214"] == checks["TG215"] == checks["TG217"] == checks["TG543"] == "passed"
    # no loss beside the output (no guard.step), no preflight: those two were not checked
    assert checks["TG542"] == checks["TG216"] == "not checked"
