"""The run folder cannot be turned against its user (issue 32), and a run owns its folder.

Planted links: for every name trainguard writes or reads in a run folder, a symbolic link to a file (or a
folder) outside it. `trainguard run` and `watch()` alone refuse the folder in one line before anything is
written; the readers (status, report, diagnose, compare) refuse the planted file in one line (exit 2) or
answer without it. In every case the file outside is neither written nor read (its secret never shows up
in what trainguard prints or writes). FIFOs and links to /dev/zero in place of each read file: one line,
never a hang, never all the memory.

Ownership: two real `trainguard run` into one folder at once: one is refused naming the holder's pid and
host; a new run into a finished folder moves the earlier run into earlier-1/ and its verdict is its own.

    PYTHONPATH=src python -m pytest -p no:xdist -q tests/test_runfolder.py
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tgtest import run_trainguard, trainguard_cmd

pytestmark = pytest.mark.process

SECRET = "SECRET-OUTSIDE-THE-RUN-FOLDER"
WRITTEN = ("status.json", ".status.reserve", "output.log", "run.db", "run.db-wal", "run.db-shm", "guard.log",
           "report.md", "report.html", "schedule.json", "preflight.json", "metrics.prom")
READ = ("status.json", "output.log", "run.db", "run.db-wal", "run.db-shm", "schedule.json")

STEPS_SCRIPT = """
import sys, trainguard
g = trainguard.watch(total_steps=30)
for i in range(30):
    g.step(3.0 / (i + 1))
    print(f"step {i} loss {3.0 / (i + 1):.3f}", flush=True)
g.finish()
"""


def _victim(tmp: Path) -> tuple[Path, Path]:
    outside = tmp / "outside"
    outside.mkdir(exist_ok=True)
    victim = outside / "victim.txt"
    victim.write_text(SECRET + "\n")
    return victim, outside


def _plant(run: Path, name: str, victim: Path, outside: Path) -> None:
    target = outside if name in ("stacks", "workers") else victim
    (run / name).symlink_to(target)


def _untouched(victim: Path, outside: Path) -> None:
    assert victim.read_text() == SECRET + "\n"
    assert sorted(p.name for p in outside.iterdir()) == ["victim.txt"]


def _one_line_2(proc: subprocess.CompletedProcess, name: str) -> None:
    assert proc.returncode == 2, (name, proc.returncode, proc.stdout[-500:], proc.stderr[-500:])
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr, (name, proc.stderr)
    assert SECRET not in proc.stdout + proc.stderr


def test_trainguard_run_refuses_a_planted_link_in_place_of_every_file(tmp_path: Path) -> None:
    victim, outside = _victim(tmp_path)
    for name in (*WRITTEN, "stacks", "workers", ".lock"):
        run = tmp_path / f"run-{name.strip('.')}"
        run.mkdir()
        _plant(run, name, victim, outside)
        proc = run_trainguard("run", "--quiet", "--run-dir", str(run), "--", sys.executable, "-c", "print(1)",
                              timeout=60)
        _one_line_2(proc, name)
        assert "symbolic link" in proc.stderr or "link planted" in proc.stderr, proc.stderr
        assert sorted(os.listdir(run)) == [name], os.listdir(run)  # refused before anything was written
        _untouched(victim, outside)


def test_watch_alone_refuses_a_planted_link_and_writes_nothing_outside(tmp_path: Path) -> None:
    victim, outside = _victim(tmp_path)
    names = (*WRITTEN, "stacks", "workers", ".lock")
    runs = []
    for name in names:
        run = tmp_path / f"run-{name.strip('.')}"
        run.mkdir()
        _plant(run, name, victim, outside)
        runs.append(str(run))
    # one interpreter tries every folder: the guard steps aside (one line on stderr, a NullGuard), the
    # training goes on unwatched rather than written through a planted link
    script = ("import sys, trainguard\n"
              "for d in sys.argv[1:]:\n"
              "    print(type(trainguard.watch(run_dir=d)).__name__)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINGUARD_")}
    proc = subprocess.run([sys.executable, "-c", script, *runs], capture_output=True, text=True, timeout=120,
                          env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["NullGuard"] * len(names), proc.stdout + proc.stderr[-2000:]
    said = [line for line in proc.stderr.splitlines() if line.startswith("trainguard: not watching this run: UserError")]
    assert len(said) == len(names) and all("symbolic link" in line for line in said), proc.stderr[-3000:]
    _untouched(victim, outside)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("template")
    script = base / "train.py"
    script.write_text(STEPS_SCRIPT)
    run = base / "run"
    proc = run_trainguard("run", "--quiet", "--run-dir", str(run), "--", sys.executable, str(script), timeout=120)
    assert proc.returncode == 0, proc.stderr
    (run / "schedule.json").write_text(json.dumps({"curve": [[0, 0.1], [30, 0.0]]}))
    return run


def _readers(run: Path, other: Path) -> list[list[str]]:
    return [["status", str(run)], ["status", str(run), "--json"], ["report", str(run)], ["diagnose", str(run)],
            ["compare", str(other), str(run), "--out", str(run.parent / f"cmp-{run.name}")]]


@pytest.mark.parametrize("kind", ["link", "fifo", "zero"])
def test_readers_never_follow_block_on_or_swallow_a_planted_file(finished_run: Path, tmp_path: Path,
                                                                    kind: str) -> None:
    victim, outside = _victim(tmp_path)
    names = READ + ("stacks",) if kind == "link" else READ
    for name in names:
        run = tmp_path / f"run-{name.strip('.')}"
        shutil.copytree(finished_run, run, symlinks=True)
        if (run / name).is_dir():
            shutil.rmtree(run / name)
        else:
            (run / name).unlink(missing_ok=True)
        if kind == "link":
            _plant(run, name, victim, outside)
        elif kind == "fifo":
            os.mkfifo(run / name)
        else:
            (run / name).symlink_to("/dev/zero")
        for args in _readers(run, finished_run):
            t0 = time.time()
            proc = run_trainguard(*args, timeout=60, env={"TRAINGUARD_DEBUG": ""})
            assert time.time() - t0 < 30, (name, args)
            assert proc.returncode in (0, 1, 2), (name, args, proc.returncode, proc.stderr[-800:])
            assert "Traceback" not in proc.stderr and SECRET not in proc.stdout + proc.stderr, (name, args, proc.stderr)
            if proc.returncode == 2:
                _one_line_2(proc, f"{name} {args[0]}")
        for written in run.glob("report.*"):
            assert SECRET not in written.read_text(errors="replace"), (name, written)
        _untouched(victim, outside)


def test_a_planted_stacks_link_is_refused_by_report_in_one_line(finished_run: Path, tmp_path: Path) -> None:
    victim, outside = _victim(tmp_path)
    (outside / "hang-0.txt").write_text(SECRET)
    run = tmp_path / "run"
    shutil.copytree(finished_run, run, symlinks=True)
    shutil.rmtree(run / "stacks", ignore_errors=True)
    (run / "stacks").symlink_to(outside)
    proc = run_trainguard("report", str(run))
    _one_line_2(proc, "stacks")
    assert "stacks is a symbolic link" in proc.stderr


# -- a run owns its folder -------------------------------------------------------------------------


def test_two_concurrent_runs_into_one_folder_one_is_refused_naming_the_holder(tmp_path: Path) -> None:
    script = tmp_path / "slow.py"
    script.write_text("import time\nfor i in range(40):\n    print('step', i, flush=True)\n    time.sleep(0.1)\n")
    run = tmp_path / "run"
    first = subprocess.Popen(trainguard_cmd("run", "--quiet", "--run-dir", str(run), "--", sys.executable,
                                            str(script)), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 30
        while not (run / "status.json").exists() and time.time() < deadline:
            time.sleep(0.1)
        second = run_trainguard("run", "--quiet", "--run-dir", str(run), "--", sys.executable, str(script))
        _one_line_2(second, "second run")
        assert f"pid {first.pid} on {socket.gethostname()}" in second.stderr, second.stderr
        assert first.wait(timeout=60) == 0, first.stderr.read() if first.stderr else ""
    finally:
        if first.poll() is None:
            first.send_signal(signal.SIGINT)
            first.wait(timeout=30)
    status = json.loads((run / "status.json").read_text())
    assert status["state"] == "completed"
    import sqlite3

    with sqlite3.connect(run / "run.db") as conn:
        starts = conn.execute("SELECT COUNT(*) FROM events WHERE kind='run' AND name='start'").fetchone()[0]
    assert starts == 1  # the refused run wrote nothing into the store


def test_a_new_run_into_a_finished_folder_keeps_the_earlier_one_apart(tmp_path: Path) -> None:
    run = tmp_path / "run"
    bad = run_trainguard("run", "--quiet", "--run-dir", str(run), "--", sys.executable, "-c", "raise SystemExit(3)")
    assert bad.returncode != 0
    good = run_trainguard("run", "--run-dir", str(run), "--", sys.executable, "-c", "print('fine')")
    assert good.returncode == 0, good.stderr
    assert f"the earlier run in {run} was moved to {run / 'earlier-1'}" in good.stderr
    now, before = json.loads((run / "status.json").read_text()), json.loads((run / "earlier-1/status.json").read_text())
    assert now["state"] == "completed" and not now["findings"], now  # none of the old run's findings
    assert before["state"] in ("failed", "crashed") and before["findings"]
    st = run_trainguard("status", str(run / "earlier-1"))
    assert st.returncode == 0 and "crashed" in st.stdout + st.stderr or "failed" in st.stdout + st.stderr


# -- the keeper's ending, from the facts in run.db ------------------------------------------------------

GUARDED = """
import sys, time, trainguard
g = trainguard.watch(total_steps=120)
for i in range(120):
    g.step(1.0 / (i + 1))
    print(f"step {i}", flush=True)
    time.sleep(0.03)
if sys.argv[1] == "crash":
    raise ValueError("late failure")
g.finish()
"""


@pytest.mark.parametrize("how", ["finish", "crash"])
def test_after_the_watchdog_is_sigkilled_status_tells_what_run_db_recorded(tmp_path: Path, how: str) -> None:
    script = tmp_path / "train.py"
    script.write_text(GUARDED)
    run = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINGUARD_")}
    watchdog = subprocess.Popen(trainguard_cmd("run", "--quiet", "--run-dir", str(run), "--", sys.executable,
                                               str(script), how), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                env=env)
    deadline = time.time() + 60
    log = run / "output.log"
    while time.time() < deadline and not (log.exists() and b"step 10\n" in log.read_bytes()):
        time.sleep(0.1)
    watchdog.kill()
    watchdog.wait()
    # the keeper holds the folder's lock while the command lives on: a second run is still refused
    second = run_trainguard("run", "--quiet", "--run-dir", str(run), "--", sys.executable, "-c", "print(1)")
    _one_line_2(second, "second run while the keeper keeps the command")
    deadline = time.time() + 90
    while time.time() < deadline and json.loads((run / "status.json").read_text()).get("reason") != "watchdog-gone":
        time.sleep(0.3)
    st = json.loads((run / "status.json").read_text())
    assert st["reason"] == "watchdog-gone" and st["step"] == 120, st  # the step run.db reached, not the stale one
    if how == "finish":
        assert st["state"] == "completed" and st["health"] == "ok", st
        assert "recorded finish() at step 120" in st["state_note"]
    else:
        assert st["state"] == "crashed" and any(f["code"] == "TG501" and "late failure" in f["summary"]
                                                for f in st["findings"]), st
    out = run_trainguard("status", str(run))
    assert out.returncode == 0
    assert not ("health error" in out.stdout and "no findings" in out.stdout), out.stdout


def test_a_sigstopped_training_process_is_named_stopped_not_a_missing_ptrace_right(tmp_path: Path) -> None:
    from trainguard.watchdog import classify, stacks

    proc = subprocess.Popen([sys.executable, "-c", "import time\nwhile True:\n    time.sleep(0.05)\n"])
    try:
        time.sleep(0.5)
        os.kill(proc.pid, signal.SIGSTOP)
        time.sleep(0.3)
        snap = stacks.collect(proc.pid, tmp_path, samples=2, interval=0.2)
        diag = classify.diagnose(snap)
        assert diag.cause == "stopped" and diag.pid == proc.pid, diag
        assert "SIGCONT" in diag.detail and "ptrace" not in diag.detail + diag.fix
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
        proc.wait()


def test_a_grandchild_that_called_setsid_is_still_a_leftover_of_the_run(tmp_path: Path) -> None:
    script, daemon, marker = tmp_path / "launch.py", tmp_path / "daemon.py", tmp_path / "daemon.pid"
    daemon.write_text(f"import os, time\nos.setsid()\nopen({str(marker)!r}, 'w').write(str(os.getpid()))\n"
                      "time.sleep(60)\n")
    script.write_text(f"import subprocess, sys, time\nsubprocess.Popen([sys.executable, {str(daemon)!r}])\n"
                      "time.sleep(1.0)\n")
    run = tmp_path / "run"
    proc = run_trainguard("run", "--quiet", "--run-dir", str(run), "--", sys.executable, str(script), timeout=90)
    status = json.loads((run / "status.json").read_text())
    assert any(f["code"] == "TG508" for f in status["findings"]), (proc.stderr, status)
    pid = int(marker.read_text())
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    else:
        os.kill(pid, signal.SIGKILL)
        raise AssertionError(f"the setsid() grandchild {pid} outlived the run")
