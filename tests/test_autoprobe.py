"""The automatic probe and its start-up bootstrap (trainguard/probe/auto.py, probe/boot/sitecustomize.py).

Real interpreters started with the bootstrap on PYTHONPATH, real torch optimizers, real `trainguard run`.
    pytest -q -n 0 tests/test_autoprobe.py
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

from tgtest import run_trainguard

from trainguard.probe.auto import bootstrap_env


def _python(code: str, run_dir: Path, cwd: Path, extra: dict | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINGUARD_")}
    env.update(bootstrap_env(env))
    env["TRAINGUARD_RUN_DIR"] = str(run_dir)
    env["TRAINGUARD_WATCHDOG"] = "1"  # as under `trainguard run`: no status.json of the probe's own
    env.update(extra or {})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


def _probe_events(run_dir: Path) -> list[tuple[str, dict]]:
    with sqlite3.connect(run_dir / "run.db") as db:
        return [(n, json.loads(d)) for n, d in db.execute("select name, data from events where kind='probe'")]


def test_a_process_that_never_imports_torch_gets_the_stack_dump_and_nothing_else(tmp_path: Path) -> None:
    r = _python("""
        import sys
        from trainguard.probe import auto, stackdump
        finders = [type(f).__name__ for f in sys.meta_path]
        print(auto._state["booted"], "torch" in sys.modules, "_AfterImport" in finders,
              stackdump._state["pid"] is not None)
    """, tmp_path / "run", tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "False", "True", "True"]
    assert list((tmp_path / "run" / "stacks").glob("proc-*.json"))


def test_the_bootstrap_runs_the_sitecustomize_it_shadows(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("import os\nos.environ['THEIR_SITECUSTOMIZE'] = 'ran'\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINGUARD_")}
    env["PYTHONPATH"] = str(theirs)
    env.update(bootstrap_env(env))
    env["TRAINGUARD_RUN_DIR"] = str(tmp_path / "run")
    r = subprocess.run([sys.executable, "-c", "import os, sitecustomize; from trainguard.probe import auto; "
                        "print(os.environ.get('THEIR_SITECUSTOMIZE'), auto._state['booted'], sitecustomize.__file__)"],
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    ran, booted, path = r.stdout.split()
    assert (ran, booted) == ("ran", "True") and path == str(theirs / "sitecustomize.py")


def test_the_first_optimizer_step_starts_the_probe_with_the_optimizers_numbers(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    r = _python("""
        import torch
        torch.manual_seed(0)
        model = torch.nn.Linear(8, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(30):
            model(torch.randn(4, 8)).pow(2).mean().backward()
            opt.step(); opt.zero_grad()
        from trainguard.probe import auto
        print(auto._state["guard"].opt_steps)
    """, run_dir, tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["30"]  # the first step counted too: the guard's hooks ran for it
    events = _probe_events(run_dir)
    assert [n for n, _ in events][:1] == ["start"] and events[0][1]["auto"] is True
    assert "finish" in [n for n, _ in events]  # reaching interpreter exit is the script's end
    with sqlite3.connect(run_dir / "run.db") as db:
        rows = db.execute("select step, lr, grad_norm, update_ratio from steps order by step").fetchall()
        timed = db.execute("select count(step_time) from steps").fetchone()[0]
    assert [r[0] for r in rows] == list(range(1, 31))
    # the optimizer hooks time no step: the README's "cannot see" says so, and what it costs (TG522)
    readme = " ".join((Path(__file__).parent.parent / "README.md").read_text().split())
    assert timed == 0 and "TG522 throughput-drop runs only with `guard.step()`" in readme
    assert all(lr == 0.1 for _, lr, _, _ in rows)
    assert all(g is not None and g > 0 for _, _, g, _ in rows[:10])
    assert all(u is not None and u > 0 for _, _, _, u in rows[:10])


def test_it_steps_aside_for_the_scripts_own_guard(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    r = _python("""
        import torch, trainguard
        model = torch.nn.Linear(8, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        guard = trainguard.watch(model, opt)
        for step in range(5):
            loss = model(torch.randn(4, 8)).pow(2).mean(); loss.backward()
            guard.step(loss); opt.step(); opt.zero_grad()
        guard.finish()
    """, run_dir, tmp_path)
    assert r.returncode == 0, r.stderr
    starts = [d for n, d in _probe_events(run_dir) if n == "start"]
    assert len(starts) == 1 and starts[0]["auto"] is False
    with sqlite3.connect(run_dir / "run.db") as db:
        assert db.execute("select count(*), count(distinct step) from steps").fetchone() == (5, 5)


def test_switched_off_by_the_environment(tmp_path: Path) -> None:
    r = _python("""
        import sys, torch
        print("_AfterImport" in [type(f).__name__ for f in sys.meta_path])
    """, tmp_path / "run", tmp_path, extra={"TRAINGUARD_AUTO": "0"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False"]
    assert not (tmp_path / "run").exists()


def test_no_auto_under_trainguard_run(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(textwrap.dedent("""
        import torch
        model = torch.nn.Linear(8, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(5):
            model(torch.randn(4, 8)).pow(2).mean().backward(); opt.step(); opt.zero_grad()
            print(f"step {step + 1} loss=1.0", flush=True)
    """))
    for flag, probes in (("--no-auto", 0), (None, 1)):
        run_dir = tmp_path / f"run{probes}"
        args = ["run", "--quiet", "--run-dir", str(run_dir)] + ([flag] if flag else []) + ["--", sys.executable,
                                                                                              "train.py"]
        r = run_trainguard(*args, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        assert len([n for n, _ in _probe_events(run_dir) if n == "start"]) == probes
        assert json.loads((run_dir / "status.json").read_text())["state"] == "completed"


def test_a_late_trainguard_watch_retires_the_automatic_probe(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    r = _python("""
        import torch, trainguard
        model = torch.nn.Linear(8, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(3):  # the automatic probe starts at the first of these
            model(torch.randn(4, 8)).pow(2).mean().backward(); opt.step(); opt.zero_grad()
        guard = trainguard.watch(model, opt)
        guard.set_step(3)
        for step in range(3):
            loss = model(torch.randn(4, 8)).pow(2).mean(); loss.backward()
            guard.step(loss); opt.step(); opt.zero_grad()
        guard.finish()
        from trainguard.probe import auto
        print(auto._state["guard"].opt_steps, guard.opt_steps)
    """, run_dir, tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["3", "6"]  # the retired probe counted no step of the script's own guard
    events = _probe_events(run_dir)
    names = [n for n, _ in events]
    assert names.count("start") == 2 and "auto-retired" in names
    assert [d["auto"] for n, d in events if n == "start"] == [True, False]
    assert names.count("finish") == 1  # the script's own guard's; the retired one does not claim the end


def test_the_stack_dump_sidecar_is_json_without_the_json_module() -> None:
    # the bootstrap writes it before anything imported json (which costs every process tens of ms)
    code = textwrap.dedent("""
        import sys
        from trainguard.probe import stackdump
        sys.modules.pop("json", None)
        info = {"pid": 5, "file": "/tmp/a\\"b\\\\c.txt", "argv": ["x", "\\u00e9", "\\x01", "\\udcff", "\\U0001f600"],
                "installed": 1.5}
        text = stackdump._to_json(info)
        import json
        assert json.loads(text) == info, text
        print("ok")
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
