"""Stacks of real stuck processes, taken the way `trainguard run` takes them at a stall, and classified.

    pytest tests/test_hang_stacks.py

Each test starts a real Python process that gets stuck (a DataLoader worker inside `__getitem__`, a
polling sleep, a plain process without the probe) and checks what `stacks.collect` and
`classify.diagnose` make of it: the probe's signal dump in the main process and in forked DataLoader
workers, py-spy for processes without the probe, and that the dump signal is never sent to a process
that has no handler for it (an unhandled real-time signal would kill it).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from trainguard.watchdog import classify, stacks

STUCK_LOADER = textwrap.dedent('''
    import sys, threading
    import torch
    PROBE = sys.argv[2] == "probe"
    if PROBE:
        import trainguard

    class Items(torch.utils.data.Dataset):
        def __len__(self):
            return 16

        def __getitem__(self, idx):
            if idx == 5:
                threading.Event().wait()  # PLANTED
            return torch.zeros(2)

    if __name__ == "__main__":
        if PROBE:
            guard = trainguard.watch(run_dir=sys.argv[1])
        print("ready", flush=True)
        for batch in torch.utils.data.DataLoader(Items(), batch_size=2, num_workers=2):
            pass
''')


def _start(tmp_path: Path, source: str, *args: str) -> tuple[subprocess.Popen, Path]:
    script = tmp_path / "stuck.py"
    script.write_text(source)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINGUARD_")}
    proc = subprocess.Popen([sys.executable, str(script), str(run_dir), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    return proc, run_dir


def _planted_line(source: str) -> int:
    return next(i for i, line in enumerate(source.splitlines(), 1) if "PLANTED" in line)


def _wait_for(predicate, timeout: float = 90.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError("timed out waiting for the process to get stuck")


def _stop(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=10)


def _workers(pid: int) -> list[int]:
    import psutil

    return [c.pid for c in psutil.Process(pid).children(recursive=True)]


def test_signal_dump_covers_main_process_and_forked_dataloader_workers(tmp_path: Path) -> None:
    proc, run_dir = _start(tmp_path, STUCK_LOADER, "probe")
    try:
        stacks_dir = run_dir / "stacks"
        # the main process and both forked workers each install the handler, into files of their own
        _wait_for(lambda: len(list(stacks_dir.glob("proc-*.json"))) >= 3 and len(_workers(proc.pid)) >= 2)
        time.sleep(1.0)  # let the workers reach the planted item
        snap = stacks.collect(proc.pid, run_dir, samples=2, interval=0.5, py_spy="")
        last = snap.samples[-1]
        assert set(last) >= {proc.pid, *_workers(proc.pid)}
        assert all(s.source == "signal" for s in last.values()), {p: s.error for p, s in last.items()}
        workers = [s for s in last.values() if s.is_dataloader_worker]
        assert len(workers) == 2
        diag = classify.diagnose(snap)
        assert diag.cause == "dataloader-worker"
        assert diag.where and diag.where.endswith(f"stuck.py:{_planted_line(STUCK_LOADER)} (__getitem__)")
        assert diag.pid in [w.pid for w in workers]
        # each dump landed in the file of the process it describes
        info = json.loads((stacks_dir / f"proc-{diag.pid}.json").read_text())
        assert "__getitem__" in Path(info["file"]).read_text()
        # saving writes the human-readable and the JSON form into stacks/
        txt = stacks.save(snap, stacks_dir, attempt=0)
        assert "DataLoader worker" in txt.read_text() and (stacks_dir / "hang-0.json").exists()
    finally:
        _stop(proc)


def test_py_spy_reads_uninstrumented_workers_with_the_sample_index(tmp_path: Path) -> None:
    spy = stacks.find_py_spy()
    if spy is None:
        pytest.skip("py-spy is not installed (the `stacks` extra)")
    proc, run_dir = _start(tmp_path, STUCK_LOADER, "noprobe")
    try:
        _wait_for(lambda: len(_workers(proc.pid)) >= 2)
        time.sleep(2.0)
        threads, err = stacks.py_spy_dump(proc.pid, spy)
        if not threads:
            pytest.skip(f"py-spy cannot read processes here: {err}")
        snap = stacks.collect(proc.pid, run_dir, samples=1, interval=0.5)
        assert all(s.source == "py-spy" for s in snap.samples[-1].values())
        diag = classify.diagnose(snap)
        assert diag.cause == "dataloader-worker"
        assert diag.where and f"stuck.py:{_planted_line(STUCK_LOADER)}" in diag.where
        assert diag.extra["sample_index"] == "5"
    finally:
        _stop(proc)


POLLING = textwrap.dedent('''
    import os, sys, time
    from trainguard.probe import stackdump
    stackdump.install(sys.argv[1])
    print("ready", flush=True)
    while not os.path.exists("/nonexistent/results.json"):
        time.sleep(0.2)  # PLANTED
''')


def test_a_polling_sleep_is_classified_as_sleep(tmp_path: Path) -> None:
    proc, run_dir = _start(tmp_path, POLLING)
    try:
        assert proc.stdout.readline().strip() == "ready"
        snap = stacks.collect(proc.pid, run_dir, samples=2, interval=0.3, py_spy="")
        diag = classify.diagnose(snap)
        assert diag.cause == "sleep", diag.detail
        assert diag.where.endswith(f"stuck.py:{_planted_line(POLLING)} (<module>)")
    finally:
        _stop(proc)


def test_the_dump_signal_is_never_sent_to_a_process_without_the_handler(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    (run_dir / "stacks").mkdir(parents=True)
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        time.sleep(0.5)
        # a sidecar that claims a handler the process does not have (a reused pid, a stale file)
        (run_dir / "stacks" / f"proc-{proc.pid}.json").write_text(json.dumps(
            {"pid": proc.pid, "signal": int(stacks_signal()), "file": str(run_dir / "x.txt"), "main_thread": "0x1"}))
        assert not stacks.catches_signal(proc.pid, int(stacks_signal()))
        snap = stacks.collect(proc.pid, run_dir, samples=1, py_spy="")
        s = snap.samples[0][proc.pid]
        assert s.source is None and "py-spy" in (s.error or "")
        time.sleep(0.3)
        assert proc.poll() is None, "the process was killed by the dump signal"
    finally:
        proc.kill()
        proc.wait()


def stacks_signal() -> int:
    from trainguard.probe.stackdump import STACK_SIGNAL

    return STACK_SIGNAL


def test_faulthandler_text_parses_into_threads_with_the_main_thread_marked() -> None:
    # the exact text CPython 3.11's faulthandler writes, produced here for real
    import faulthandler
    import tempfile
    import threading

    with tempfile.TemporaryFile("w+") as fh:
        faulthandler.dump_traceback(file=fh, all_threads=True)
        fh.seek(0)
        text = fh.read()
    threads = stacks.parse_faulthandler(text, f"0x{threading.main_thread().ident:016x}")
    main = [t for t in threads if t.main]
    assert len(main) == 1
    assert main[0].frames[-1].function == "test_faulthandler_text_parses_into_threads_with_the_main_thread_marked"
    assert main[0].frames[-1].code and "dump_traceback" in main[0].frames[-1].code


def test_files_of_workers_that_ended_without_dumping_are_swept(tmp_path: Path) -> None:
    from trainguard.probe import stackdump

    folder = tmp_path / "stacks"
    folder.mkdir()
    ended = []
    for _ in range(2):
        p = subprocess.Popen([sys.executable, "-c", "pass"])
        p.wait()
        ended.append(p.pid)
    silent, dumped, live = ended[0], ended[1], os.getpid()
    for pid, text in ((silent, ""), (dumped, "Thread 0x1 (most recent call first):\n"), (live, "")):
        (folder / f"proc-{pid}.json").write_text("{}")
        (folder / f"proc-{pid}.txt").write_text(text)
    assert stackdump.prune(folder) == 1
    assert not (folder / f"proc-{silent}.json").exists() and not (folder / f"proc-{silent}.txt").exists()
    assert (folder / f"proc-{dumped}.txt").exists()  # it dumped: evidence, kept
    assert (folder / f"proc-{live}.json").exists()  # alive: kept


@pytest.mark.process
def test_a_run_started_from_a_watched_process_takes_its_stacks_into_its_own_folder(tmp_path: Path) -> None:
    # A process that called watch() (a notebook, a test runner, an outer `trainguard run`) carries
    # TRAINGUARD_STACKS for its own children: a `trainguard run` it starts must not inherit it, or the new
    # run's processes dump into the old folder and its watchdog, looking in its own, sees no stack at all
    # (TG712 never came in a full test run for that reason).
    from tgtest import run_trainguard

    stale = tmp_path / "outer" / "stacks"
    stale.mkdir(parents=True)
    script = tmp_path / "child.py"
    script.write_text("import os; print('child', os.getpid(), flush=True)\n")
    out = run_trainguard("run", "--run-dir", str(tmp_path / "run"), "--", sys.executable, str(script),
                         cwd=tmp_path, env={"TRAINGUARD_STACKS": str(stale)})
    assert out.returncode == 0, out.stderr
    pid = int(out.stdout.split("child", 1)[1].split()[0])
    assert (tmp_path / "run" / "stacks" / f"proc-{pid}.json").exists()
    # (the trainguard process itself is the caller's child: its own files stay in the caller's folder)
    assert not (stale / f"proc-{pid}.json").exists()
