"""Fault injection: what goes wrong around a run must never reach the training, nor leave a lie behind.

Each test breaks one thing for real (a size-limited tmpfs that fills up, a row SQLite refuses, a
status.json replaced by a directory, a SIGKILL of `trainguard run`, guard calls from several threads)
and checks three things: the training was not harmed, status.json tells what happened, and no step was
silently lost. The full-disk tests mount a tmpfs, which needs root (CI runs as root); elsewhere they
skip. Run alone with `python -m pytest -q tests/test_faults.py`.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tgtest import run_trainguard, trainguard_cmd

from trainguard.store.selflog import MAX_BYTES, GuardLog
from trainguard.store.status import read_status
from trainguard.store.writer import StoreWriter


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs: a disk the run can fill."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def _steps(run_dir: Path) -> list[tuple]:
    with sqlite3.connect(run_dir / "run.db") as conn:
        return conn.execute("SELECT step, loss, rank FROM steps ORDER BY step").fetchall()


CHATTY = """
import sys
for i in range(40000):
    print(f"line {i} " + "x" * 100)
print("done", flush=True)
"""


def test_full_disk_keeps_the_output_flowing_and_status_true(tmp_path: Path, small_disk: Path) -> None:
    script = tmp_path / "chatty.py"
    script.write_text(CHATTY)
    run_dir = small_disk / "run"
    out = run_trainguard("run", "--run-dir", str(run_dir), "--stall-timeout", "20", "--",
                         sys.executable, str(script), timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.count("\n") == 40001 and out.stdout.endswith("done\n")  # the terminal got every line
    assert out.stderr.count("cannot write") == 1  # said once
    assert "No space left on device" in out.stderr
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "completed"
    assert status["output_dropped_bytes"] > 0
    assert not (run_dir / ".status.reserve").exists()


FILLS_DISK = """
import sys, torch, trainguard
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
guard = trainguard.watch(model, opt, total_steps=300)
junk = open(sys.argv[1], "wb")
for i in range(300):
    loss = model(torch.randn(8, 4)).pow(2).mean()
    loss.backward(); opt.step(); opt.zero_grad(); guard.step(loss)
    if i == 50:
        try:
            while True:
                junk.write(b"x" * 65536); junk.flush()
        except OSError:
            pass  # the disk is full now: the rest of the run and its end happen on a full disk
    print("step", i, flush=True)
guard.finish()
"""


def test_a_run_that_fills_the_disk_ends_with_a_true_status(tmp_path: Path, small_disk: Path) -> None:
    script = tmp_path / "fill.py"
    script.write_text(FILLS_DISK)
    run_dir = small_disk / "run"
    out = run_trainguard("run", "--run-dir", str(run_dir), "--stall-timeout", "30", "--",
                         sys.executable, str(script), str(small_disk / "junk"), timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "step 299" in out.stdout
    assert json.loads((run_dir / "status.json").read_text())["state"] == "completed"


def test_a_row_the_store_refuses_is_dropped_once_not_retried(tmp_path: Path) -> None:
    writer = StoreWriter(tmp_path, rank=0)
    writer.add_step({"step": 1, "t": time.time(), "loss": 1.0})
    writer.add_event("phase", ("eval", "val"), {"edge": "begin"}, step=1)  # a tuple SQLite cannot bind
    writer.add_step({"step": 2, "t": time.time(), "loss": 0.5})
    writer.flush()
    for step in range(3, 50):
        writer.add_step({"step": step, "t": time.time(), "loss": 0.1})
        writer.flush()
    writer.close()
    assert [s for s, *_ in _steps(tmp_path)] == list(range(1, 50))
    assert writer.refused == 1 and "tuple" in (writer.first_refusal or "")
    assert writer.failed_flushes == 0


BAD_PHASE = """
import sys, torch, trainguard
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
guard = trainguard.watch(model, opt, total_steps=900, run_dir=sys.argv[1])
for i in range(900):
    if i == 10:
        with guard.phase(("eval", "val")):
            pass
    loss = model(torch.randn(8, 4)).pow(2).mean()
    loss.backward(); opt.step(); opt.zero_grad(); guard.step(loss)
guard.finish()
"""


def test_a_non_text_phase_name_costs_no_step(tmp_path: Path) -> None:
    script = tmp_path / "bad_phase.py"
    script.write_text(BAD_PHASE)
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "run")], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    rows = _steps(tmp_path / "run")
    assert [s for s, *_ in rows] == list(range(1, 901))
    assert all(loss is not None for _, loss, _ in rows)
    assert read_status(tmp_path / "run")["state"] == "completed"


STATUS_IS_A_DIR = """
import os, sys, time, torch, trainguard
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
guard = trainguard.watch(model, opt, total_steps=100, run_dir=sys.argv[1])
os.replace(os.path.join(sys.argv[1], "status.json"), os.path.join(sys.argv[1], "old.json")) \\
    if os.path.exists(os.path.join(sys.argv[1], "status.json")) else None
os.mkdir(os.path.join(sys.argv[1], "status.json"))
for i in range(100):
    loss = model(torch.randn(8, 4)).pow(2).mean()
    loss.backward(); opt.step(); opt.zero_grad(); guard.step(loss)
    time.sleep(0.3)  # 30 s: longer than the 20 errors that used to switch the guard off
guard.finish()
"""


def test_status_json_replaced_by_a_directory_neither_stops_recording_nor_floods(tmp_path: Path) -> None:
    script = tmp_path / "status_dir.py"
    script.write_text(STATUS_IS_A_DIR)
    run_dir = tmp_path / "run"
    done = subprocess.run([sys.executable, str(script), str(run_dir)], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    assert [s for s, *_ in _steps(run_dir)] == list(range(1, 101))  # recording never stopped
    log = (run_dir / "guard.log").read_text()
    assert log.count("Traceback") <= 2 and len(log.splitlines()) < 80, log  # status while running, at the end
    assert "switched itself off" not in log


def test_guard_log_is_deduplicated_by_kind_and_bounded(tmp_path: Path) -> None:
    log = GuardLog(tmp_path)
    for i in range(500):
        try:
            open(tmp_path / f"missing-{i}-{os.urandom(4).hex()}")  # a new message every time, one kind
        except OSError as exc:
            log.error("status write", exc)
    text = (tmp_path / "guard.log").read_text()
    assert text.count("error in status write: FileNotFoundError") == 3  # the first (with its traceback), 10, 100
    assert text.count("Traceback") == 1
    assert "seen 10 times" in text and "seen 100 times" in text
    for i in range(20000):
        log.once(f"kind {i}", "x" * 200)
    assert (tmp_path / "guard.log").stat().st_size <= MAX_BYTES
    assert "nothing more is written" in (tmp_path / "guard.log").read_text()


PRINTER = """
import sys, time
for i in range(60):
    print(f"tick {i}", flush=True)
    time.sleep(0.1)
open(sys.argv[1], "w").write("ok")
"""


def test_sigkill_of_trainguard_run_leaves_the_command_running_and_no_lie(tmp_path: Path) -> None:
    script = tmp_path / "printer.py"
    script.write_text(PRINTER)
    run_dir = tmp_path / "run"
    marker = tmp_path / "done"
    env = {k: v for k, v in os.environ.items() if k != "TRAINGUARD_RUN_DIR"}
    watchdog = subprocess.Popen(trainguard_cmd("run", "--run-dir", str(run_dir), "--", sys.executable, str(script),
                                               str(marker)),
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    deadline = time.time() + 60
    while time.time() < deadline and not (run_dir / "status.json").exists():
        time.sleep(0.1)
    time.sleep(1.0)
    watchdog.kill()
    watchdog.wait()
    time.sleep(1.0)
    st = read_status(run_dir)
    assert st["state"] == "running" and st["watched_by"] == "keeper", st  # says it goes on unwatched
    deadline = time.time() + 60
    while time.time() < deadline and not marker.exists():
        time.sleep(0.2)
    assert marker.exists(), "the command died with its watchdog"
    time.sleep(1.0)
    st = read_status(run_dir)
    assert st["state"] == "failed" and st["reason"] == "watchdog-gone", st  # never `running` forever
    assert "tick 59" in (run_dir / "output.log").read_text()  # the keeper kept the output
    assert "tick 59" in watchdog.stdout.read().decode()  # ...and passed it on to the terminal


def test_readers_say_when_the_owner_of_a_running_run_is_gone(tmp_path: Path) -> None:
    # a status.json left `running` by a process that no longer exists (its pid now free or reused)
    sleeper = subprocess.Popen([sys.executable, "-c", "pass"])
    sleeper.wait()
    status = {"state": "running", "step": 12, "pid": sleeper.pid, "watched_by": "watchdog",
              "owner": {"pid": sleeper.pid, "started": time.time() - 100}, "findings": [], "updated": time.time()}
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "status.json").write_text(json.dumps(status))
    out = run_trainguard("status", str(run_dir))
    assert out.returncode == 0, out.stderr
    head = out.stdout.splitlines()[0]
    assert "abandoned" in head and "running" not in head and "owner process is gone" in out.stdout
    out = run_trainguard("ls", "--root", str(tmp_path))
    assert "abandoned" in out.stdout, out.stdout
    out = run_trainguard("report", str(run_dir), "--print")
    assert "abandoned" in out.stdout, out.stdout + out.stderr
    # the owner alive (this very process) keeps `running`
    status["owner"] = {"pid": os.getpid(), "started": None}
    (run_dir / "status.json").write_text(json.dumps(status))
    assert read_status(run_dir)["state"] == "running"


def test_pid_reused_by_another_process_is_not_the_owner(tmp_path: Path) -> None:
    status = {"state": "running", "owner": {"pid": os.getpid(), "started": 1.0}, "findings": []}
    (tmp_path / "status.json").write_text(json.dumps(status))
    assert read_status(tmp_path)["state"] == "abandoned"


def test_threads_do_not_break_the_writer(tmp_path: Path) -> None:
    writer = StoreWriter(tmp_path, rank=0)
    stop = threading.Event()

    def flusher() -> None:
        while not stop.is_set():
            writer.flush()
            time.sleep(0.001)

    threads = [threading.Thread(target=flusher) for _ in range(3)]
    for t in threads:
        t.start()
    for step in range(1, 5001):
        writer.add_step({"step": step, "t": time.time(), "loss": 1.0 / step})
    stop.set()
    for t in threads:
        t.join()
    writer.close()
    assert [s for s, *_ in _steps(tmp_path)] == list(range(1, 5001))


def test_sigkill_of_the_command_under_the_watchdog_is_told_as_killed(tmp_path: Path) -> None:
    script = tmp_path / "printer.py"
    script.write_text(PRINTER)
    run_dir = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k != "TRAINGUARD_RUN_DIR"}
    watchdog = subprocess.Popen(trainguard_cmd("run", "--run-dir", str(run_dir), "--", sys.executable, str(script),
                                               str(tmp_path / "m")),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    deadline = time.time() + 60
    while time.time() < deadline and "pid" not in (read_status(run_dir) if (run_dir / "status.json").exists()
                                                  else {}):
        time.sleep(0.1)
    os.kill(read_status(run_dir)["pid"], signal.SIGKILL)
    assert watchdog.wait(timeout=60) != 0
    st = read_status(run_dir)
    assert st["state"] == "killed" and st["signal"] == "SIGKILL", st



LAUNCHER_SIGNAL = """
import signal, sys, time
class SignalException(Exception):
    pass
def raise_on(signum, frame):  # what torchrun's agent does with SIGTERM: an exception, then exit code 1
    raise SignalException(f"Process {__import__('os').getpid()} got signal: {signum}")
signal.signal(signal.SIGTERM, raise_on)
print("training", flush=True)
time.sleep(120)
"""


def test_a_run_the_user_ends_with_sigterm_is_killed_not_a_crash_of_its_launcher(tmp_path: Path) -> None:
    """`timeout 150 trainguard run -- torchrun ...` (or a scheduler's SIGTERM): trainguard passes the signal
    on; torchrun turns it into a SignalException and exit code 1. The verdict is the signal, not a crash of
    the launcher whose traceback is only its consequence."""
    script = tmp_path / "launcher.py"
    script.write_text(LAUNCHER_SIGNAL)
    run_dir = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k != "TRAINGUARD_RUN_DIR"}
    watchdog = subprocess.Popen(trainguard_cmd("run", "--run-dir", str(run_dir), "--", sys.executable, str(script)),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert watchdog.stdout is not None
    assert watchdog.stdout.readline().strip() == "training"
    time.sleep(0.5)
    watchdog.send_signal(signal.SIGTERM)
    out, err = watchdog.communicate(timeout=60)
    st = read_status(run_dir)
    assert st["state"] == "killed" and st["signal"] == "SIGTERM", (st, err[-2000:])
    assert watchdog.returncode == 128 + signal.SIGTERM, err[-2000:]
    assert "run-crashed" not in err and "TG503 run-killed" in err, err[-2000:]


RANK_FAILS = """
import os, sys, torch, torch.distributed as dist, trainguard
dist.init_process_group("gloo", timeout=__import__("datetime").timedelta(seconds=60))
rank = dist.get_rank()
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
guard = trainguard.watch(model, opt, total_steps=100)
for i in range(100):
    loss = model(torch.randn(8, 4)).pow(2).mean()
    loss.backward()
    if rank == 1 and i == 20:
        raise ValueError("bad batch shape on rank 1")
    for p in model.parameters():
        dist.all_reduce(p.grad)
    opt.step(); opt.zero_grad(); guard.step(loss)
guard.finish()
"""

LAUNCH = """
import os, socket, subprocess, sys
with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
procs = [subprocess.Popen([sys.executable, sys.argv[1]], env={**os.environ, "RANK": str(r), "WORLD_SIZE": "2",
         "LOCAL_RANK": str(r), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}) for r in range(2)]
sys.exit(max(p.wait() for p in procs))
"""


def test_the_first_rank_to_fail_is_the_cause(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(RANK_FAILS)
    (tmp_path / "launch.py").write_text(LAUNCH)
    run_dir = tmp_path / "run"
    out = run_trainguard("run", "--run-dir", str(run_dir), "--", sys.executable, str(tmp_path / "launch.py"),
                         str(tmp_path / "train.py"), timeout=240)
    assert out.returncode == 1, out.stderr[-3000:]
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "crashed"
    crash = next(f for f in status["findings"] if f["code"] == "TG501")
    assert crash["exception"] == "ValueError" and crash["evidence"]["rank"] == 1, crash
    assert "bad batch shape" in crash["summary"]
    assert any("rank 0" in c for c in crash["evidence"]["consequences"]), crash["evidence"]


TWO_THREADS = """
import sys, threading, torch, trainguard
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
guard = trainguard.watch(model, opt, total_steps=200, run_dir=sys.argv[1])
again = trainguard.watch(model, opt, total_steps=200)  # a second watch() in the same process
again.step(1.0)

def side():
    for _ in range(200):
        guard.step(torch.tensor(5.0))  # a second thread calling guard.step

t = threading.Thread(target=side, name="side-thread")
for i in range(200):
    if i == 5:
        t.start()
    loss = model(torch.randn(8, 4)).pow(2).mean()
    loss.backward(); opt.step(); opt.zero_grad(); guard.step(loss)
t.join()
guard.finish()
"""


def test_a_second_thread_and_a_second_watch_are_refused_once_without_bad_rows(tmp_path: Path) -> None:
    script = tmp_path / "threads.py"
    script.write_text(TWO_THREADS)
    run_dir = tmp_path / "run"
    done = subprocess.run([sys.executable, str(script), str(run_dir)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("watch() called again") == 1
    assert done.stderr.count("guard.step called from thread 'side-thread'") == 1
    rows = _steps(run_dir)
    assert [s for s, *_ in rows] == list(range(1, 201))  # no duplicate, no gap
    assert all(loss is not None and loss < 5.0 for _, loss, _ in rows)  # no NULL, none from the other thread
    assert "side-thread" in (run_dir / "guard.log").read_text()


STORE_FAULT = """
import os, shutil, sqlite3, sys, threading, time, torch, trainguard
run_dir, fault = sys.argv[1], sys.argv[2]
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
guard = trainguard.watch(model, opt, total_steps=300, run_dir=run_dir)
lock = None
for i in range(300):
    if i == 50 and fault == "locked":
        lock = sqlite3.connect(os.path.join(run_dir, "run.db"), isolation_level=None, check_same_thread=False)
        lock.execute("BEGIN EXCLUSIVE")  # another process holds the database for 3 s
        threading.Timer(3.0, lambda: lock.execute("COMMIT")).start()
    if i == 50 and fault == "deleted":
        shutil.rmtree(run_dir)
    loss = model(torch.randn(8, 4)).pow(2).mean()
    loss.backward(); opt.step(); opt.zero_grad(); guard.step(loss)
    time.sleep(0.01)
guard.finish()
print("trained 300 steps", flush=True)
"""


def _store_fault(tmp_path: Path, run_dir: Path, fault: str) -> subprocess.CompletedProcess:
    script = tmp_path / "store_fault.py"
    script.write_text(STORE_FAULT)
    done = subprocess.run([sys.executable, str(script), str(run_dir), fault], capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 0 and "trained 300 steps" in done.stdout, done.stderr  # the training never noticed
    return done


def test_a_locked_store_loses_nothing(tmp_path: Path) -> None:
    _store_fault(tmp_path, tmp_path / "run", "locked")
    assert [s for s, *_ in _steps(tmp_path / "run")] == list(range(1, 301))
    assert read_status(tmp_path / "run")["state"] == "completed"


def test_a_deleted_run_folder_costs_the_watching_not_the_training(tmp_path: Path) -> None:
    _store_fault(tmp_path, tmp_path / "run", "deleted")



@pytest.fixture
def failing_disk(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """An ext4 file system on a loop device mounted `errors=remount-ro`, and the kernel's switch that makes
    it fail (`/sys/fs/ext4/<dev>/trigger_fs_error`): writing to it records a file-system error, and the
    kernel remounts it read-only at once, as after a real I/O error. Writes through files already open
    fail from then on too (EROFS), which a remount from user space refuses to do while files are open."""
    if os.geteuid() != 0:
        pytest.skip("a loop device needs root (CI runs as root)")
    image, mnt = tmp_path / "disk.img", tmp_path / "disk"
    mnt.mkdir()
    with open(image, "wb") as fh:
        fh.truncate(64 << 20)
    made = subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], capture_output=True)
    mounted = made.returncode == 0 and subprocess.run(
        ["mount", "-o", "loop,errors=remount-ro", str(image), str(mnt)], capture_output=True).returncode == 0
    if not mounted:
        pytest.skip(f"cannot make and mount an ext4 loop device here: {made.stderr.decode().strip()}")
    try:
        device = subprocess.run(["findmnt", "-n", "-o", "SOURCE", str(mnt)], capture_output=True, text=True)
        trigger = Path("/sys/fs/ext4") / Path(device.stdout.strip()).name / "trigger_fs_error"
        if not trigger.exists():
            pytest.skip(f"this kernel has no {trigger}")
        yield mnt, trigger
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


WAITS_FOR_THE_FAULT = """
import sys, time, torch, trainguard
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
guard = trainguard.watch(model, opt, total_steps=300)
for i in range(1, 301):
    loss = model(torch.randn(8, 4)).pow(2).mean()
    loss.backward(); opt.step(); opt.zero_grad(); guard.step(loss)
    print("step", i, flush=True)
    if i == 100:
        sys.stdin.readline()  # the test makes the disk fail now
    time.sleep(0.01)
guard.finish()
print("trained 300 steps", flush=True)
"""


def test_a_run_folder_gone_read_only_mid_run_costs_no_step_in_silence(tmp_path: Path,
                                                                        failing_disk: tuple[Path, Path]) -> None:
    mnt, trigger = failing_disk
    script = tmp_path / "train.py"  # the script lives off the failing disk, as code usually does
    script.write_text(WAITS_FOR_THE_FAULT)
    run_dir = mnt / "run"
    env = {k: v for k, v in os.environ.items() if k != "TRAINGUARD_RUN_DIR"}
    proc = subprocess.Popen(trainguard_cmd("run", "--run-dir", str(run_dir), "--", sys.executable, str(script)),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stdin is not None and proc.stdout is not None
    printed = []
    for line in proc.stdout:
        printed.append(line)
        if line.strip() == "step 100":
            time.sleep(1.0)  # the probe stores step 100 (it flushes every 0.5 s)
            trigger.write_text("trainguard fault test: the disk under the run folder fails\n")
            proc.stdin.write("\n")
            proc.stdin.flush()
            break
    out, err = proc.communicate(timeout=240)
    printed += out.splitlines(True)
    # 0 training failures caused by the guard: the training went on to its end, exit 0, every line shown
    assert proc.returncode == 0, err[-3000:]
    assert [x.strip() for x in printed] == [f"step {i}" for i in range(1, 301)] + ["trained 300 steps"]
    assert "Traceback" not in err
    # the disk really is read-only now: the run folder keeps what it had when it failed
    assert subprocess.run(["touch", str(run_dir / "x")], capture_output=True).returncode != 0
    stored = [s for s, *_ in _steps(run_dir)]
    assert stored == list(range(1, len(stored) + 1)) and 95 <= len(stored) <= 100, stored[-5:]
    # 0 steps silently lost: the probe counts the rows the store never took and says so, once
    lost = [line for line in err.splitlines() if "could not be stored" in line and "step row(s)" in line]
    assert len(lost) == 1, err
    assert f"{300 - len(stored)} step row(s) ({len(stored) + 1}-300)" in lost[0], lost
    assert "went on to step 300" in lost[0]
    # status.json cannot be true on a read-only disk: the guard says once why, and the readers do not
    # take its 'running' for the truth
    assert err.count("status.json could not be updated to 'completed' (Read-only file system)") == 1, err
    assert "probe-not-finished" not in err and "log-flood" not in err  # no finding the fault made up
    shown = run_trainguard("status", str(run_dir))
    assert shown.returncode == 0 and ": abandoned, step 100/300" in shown.stdout, shown.stdout
    assert "status.json says running, but its owner process is gone" in shown.stdout


def test_write_permission_taken_from_the_run_folder_mid_run(tmp_path: Path) -> None:
    """The same fault where no loop device can be made: `trainguard run` and the training run as an
    unprivileged user, and the run folder and its files lose their write permission at step 100. Files
    already open stay writable (the store, output.log); what needs a new file (status.json's atomic
    replace, guard.log) fails with EACCES."""
    if os.geteuid() != 0 or subprocess.run(["which", "setpriv"], capture_output=True).returncode != 0:
        pytest.skip("needs root and setpriv to run the command as another user")
    user = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"]
    # The user must be able to start this interpreter as a child (as the watchdog does), which a venv
    # whose python links into root's private home (pyenv under /root) does not allow.
    starts = subprocess.run(user + [sys.executable, "-c", "import subprocess, sys; subprocess.run([sys.executable, "
                                    "'-c', 'import torch, trainguard'], check=True)"],
                            capture_output=True, text=True, timeout=120, cwd="/")
    if starts.returncode != 0:
        pytest.skip(f"the user nobody cannot start {sys.executable} ({starts.stderr.strip()[-200:]})")
    base = Path(tempfile.mkdtemp(prefix="tg-perm-"))  # tmp_path is root's alone: the user could not enter it
    try:
        os.chown(base, 65534, 65534)
        script = base / "train.py"
        script.write_text(WAITS_FOR_THE_FAULT)
        run_dir = base / "run"
        env = {k: v for k, v in os.environ.items() if k != "TRAINGUARD_RUN_DIR"}
        env.update(HOME=str(base), TRAINGUARD_RUNS_ROOT=str(base / "runs"))
        proc = subprocess.Popen(user + trainguard_cmd("run", "--run-dir", str(run_dir), "--", sys.executable,
                                                      str(script)),
                                cwd=base, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=env)
        assert proc.stdin is not None and proc.stdout is not None
        printed = []
        for line in proc.stdout:
            printed.append(line)
            if line.strip() == "step 100":
                time.sleep(1.0)
                for path in [run_dir, *run_dir.rglob("*")]:
                    os.chmod(path, path.stat().st_mode & ~0o222)
                proc.stdin.write("\n")
                proc.stdin.flush()
                break
        out, err = proc.communicate(timeout=240)
        printed += out.splitlines(True)
        assert proc.returncode == 0, err[-3000:]
        assert [x.strip() for x in printed] == [f"step {i}" for i in range(1, 301)] + ["trained 300 steps"]
        assert "Traceback" not in err
        stored = [s for s, *_ in _steps(run_dir)]
        assert stored == list(range(1, len(stored) + 1)), stored[-5:]
        lost = [line for line in err.splitlines() if "could not be stored" in line and "step row(s)" in line]
        if len(stored) < 300:  # every step is stored, or the missing ones are counted and said
            assert len(lost) == 1 and f"{300 - len(stored)} step row(s)" in lost[0], err
        else:
            assert not lost, err
        st = read_status(run_dir)
        if st["state"] != "completed":
            assert err.count("status.json could not be updated to 'completed' (Permission denied)") == 1, err
            shown = run_trainguard("status", str(run_dir))
            assert ": abandoned," in shown.stdout, shown.stdout
        assert "probe-not-finished" not in err and "log-flood" not in err
    finally:
        subprocess.run(["chmod", "-R", "u+w", str(base)], capture_output=True)
        subprocess.run(["rm", "-rf", str(base)], capture_output=True)


LAUNCHER_HANG = """
import signal, threading, time
class SignalException(Exception):
    pass
def raise_on(signum, frame):  # what torchrun's agent does with SIGTERM: an exception, then exit code 1
    raise SignalException(f"got signal: {signum}")
signal.signal(signal.SIGTERM, raise_on)
print("training", flush=True)
lock = threading.Lock()
lock.acquire()
lock.acquire()  # waits for itself: proof, stopped at the first look
"""


def test_a_run_trainguard_stops_says_so_beside_the_exit_code_its_launcher_made_of_the_stop(tmp_path: Path) -> None:
    """A hung torchrun job stopped by trainguard: torchrun turns the SIGTERM into a SignalException and exit
    code 1, trainguard exits 124. The summary says who stopped it, its own exit code, and the command's as
    the consequence (a new user read 'run hung (exit code 1)' beside trainguard's 124)."""
    script = tmp_path / "launcher.py"
    script.write_text(LAUNCHER_HANG)
    env = {k: v for k, v in os.environ.items() if k != "TRAINGUARD_RUN_DIR"}
    r = subprocess.run(trainguard_cmd("run", "--run-dir", str(tmp_path / "run"), "--stall-timeout", "3", "--",
                                      sys.executable, str(script)), capture_output=True, text=True, env=env,
                       timeout=120)
    assert r.returncode == 124, r.stderr[-2000:]
    head = next(line for line in r.stderr.splitlines() if line.startswith("trainguard: run hung"))
    assert head.startswith("trainguard: run hung (stopped by trainguard, exit 124; the command exited with code 1 "
                           "on that stop) after "), head
    shown = subprocess.run(trainguard_cmd("status", str(tmp_path / "run")), capture_output=True, text=True,
                           timeout=60)
    assert "hung (stopped by trainguard; the command exited with code 1 on that stop)" in shown.stdout, shown.stdout
    # the report says it the same way, in its facts and at the end of its timeline (status, report and the
    # summary share the words: store/ending.py's how_it_exited)
    md = (tmp_path / "run" / "report.md").read_text()
    facts = md.splitlines()[2]
    assert "stopped by trainguard; the command exited with code 1 on that stop" in facts and "exit code 1" not in facts
    assert "run ended: hung (stopped by trainguard; the command exited with code 1 on that stop)" in md, md


AGENT = """
import subprocess, sys, time
# a launcher's worker: inherits the output pipes and outlives its agent (torchrun's ranks, orphaned)
rank = subprocess.Popen([sys.executable, "-c", "import time\\nwhile True: print('rank step', flush=True); time.sleep(0.3)"])
open(sys.argv[1], "w").write(str(rank.pid))
print("agent up", flush=True)
time.sleep(300)
"""


def test_a_node_whose_watchdog_and_agent_were_killed_is_abandoned_not_running(tmp_path: Path) -> None:
    """One node of a run over nodes loses its `trainguard run` and its torchrun agent (SIGKILL, as the zoo's
    nodes_agent_killed does); its ranks live on as orphans holding the output pipes, so the output keeper
    lives on too. Nothing runs the job there any more: that node (and `status` of the whole run) says
    `abandoned`, not `running`."""
    import psutil

    (tmp_path / "agent.py").write_text(AGENT)
    run_dir = tmp_path / "run"
    pid_file = tmp_path / "rank.pid"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINGUARD_")}
    watchdog = subprocess.Popen(trainguard_cmd("run", "--run-dir", str(run_dir / "node-1"), "--", sys.executable,
                                               str(tmp_path / "agent.py"), str(pid_file)),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    rank = None
    try:
        deadline = time.time() + 60
        while time.time() < deadline and not (pid_file.exists() and pid_file.read_text()):
            time.sleep(0.2)
        rank = int(pid_file.read_text())
        time.sleep(1.0)  # a status.json with the command's pid
        agent = read_status(run_dir / "node-1")["pid"]
        watchdog.kill()
        watchdog.wait()
        deadline = time.time() + 30
        while time.time() < deadline and read_status(run_dir / "node-1").get("watched_by") != "keeper":
            time.sleep(0.2)
        assert read_status(run_dir / "node-1")["state"] == "running"  # the keeper: the command goes on unwatched
        os.kill(agent, signal.SIGKILL)
        deadline = time.time() + 10
        while time.time() < deadline and psutil.pid_exists(agent) and psutil.Process(agent).status() != "zombie":
            time.sleep(0.1)
        st = read_status(run_dir / "node-1")
        assert st["state"] == "abandoned" and "gone" in st["state_note"], st
        merged = read_status(run_dir)
        assert merged["nodes"]["1"]["state"] == "abandoned" and merged["state"] == "abandoned", merged
        shown = run_trainguard("status", str(run_dir))
        assert "abandoned" in shown.stdout.splitlines()[0] and "node 1 abandoned" in shown.stdout, shown.stdout
    finally:
        if rank is not None:
            os.kill(rank, signal.SIGKILL)
        if watchdog.poll() is None:
            watchdog.kill()
