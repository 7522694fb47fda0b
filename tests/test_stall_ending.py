"""A stall ends on progress only: what a run prints while it fails or dies never ends it.

A new user's collective mismatch stalled under `trainguard run`; they pressed Ctrl-C, torchrun printed
"Sending process N closing signal SIGTERM" and a traceback, and the stall was recorded as "progress
resumed: slow, not hung". These run `trainguard run` on real scripts, send real signals, and read the
run folder's status.json.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
from tgtest import trainguard_cmd

from trainguard.store.status import read_status
from trainguard.watchdog.dying import ProgressLines

INTERRUPTED = textwrap.dedent('''
    import time, traceback
    print("step 1 loss 0.52", flush=True)
    try:
        time.sleep(600)  # stuck (a collective no other rank joins, say)
    except KeyboardInterrupt:
        traceback.print_exc()
        print("interrupted, saving what we have", flush=True)  # a handler that prints, then takes its time
        time.sleep(3)
        raise
''')

NOISY_HANG = textwrap.dedent('''
    import threading, time, traceback, warnings
    print("step 1 loss 0.52", flush=True)

    def noise():  # a library thread that warns and logs handled errors while the loop is stuck
        while True:
            warnings.warn("the metrics server is slow", UserWarning)
            try:
                raise ConnectionError("metrics server unreachable")
            except ConnectionError:
                traceback.print_exc()
            time.sleep(0.7)

    warnings.simplefilter("always")
    threading.Thread(target=noise, daemon=True).start()
    time.sleep(25)  # stuck long past --hang-limit; without it the run would end by itself, exit 0
''')


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("TRAINGUARD_")}


def test_what_a_stalled_run_prints_after_ctrl_c_does_not_end_its_stall(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(INTERRUPTED)
    run_dir = tmp_path / "run"
    # Ctrl-C as a terminal delivers it: a process started with SIGINT ignored (pytest-xdist's workers are)
    # passes that on to what it starts, and a script that ignores SIGINT is never interrupted, guarded or not
    watchdog = subprocess.Popen(trainguard_cmd("run", "--run-dir", str(run_dir), "--stall-timeout", "2", "--no-auto",
                                               "--", sys.executable, "train.py"),
                                cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert watchdog.stderr is not None
    seen = []
    deadline = time.time() + 90
    while time.time() < deadline:
        line = watchdog.stderr.readline()
        seen.append(line)
        if "run-stalled" in line or not line:
            break
    assert "run-stalled" in seen[-1], "".join(seen)[-2000:]
    watchdog.send_signal(signal.SIGINT)
    try:
        # the script takes 3 s over its interrupt, then the watchdog writes its ending
        _, err = watchdog.communicate(timeout=150)
    except subprocess.TimeoutExpired:
        for proc in [*psutil.Process(watchdog.pid).children(recursive=True), watchdog]:
            proc.kill()
        _, err = watchdog.communicate(timeout=30)
        raise AssertionError("the watchdog did not end 150 s after Ctrl-C:\n" + ("".join(seen) + err)[-3000:]) from None
    err = "".join(seen) + err
    assert "KeyboardInterrupt" in err and "interrupted, saving" in (run_dir / "output.log").read_text()
    assert "stall ended" not in err, err[-3000:]
    stalled = next(f for f in read_status(run_dir)["findings"] if f["name"] == "run-stalled")
    assert stalled["severity"] == "warning" and "stall_ended_by" not in stalled["evidence"], stalled


def test_tracebacks_and_warnings_printed_during_a_stall_are_not_progress(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(NOISY_HANG)
    run_dir = tmp_path / "run"
    r = subprocess.run(trainguard_cmd("run", "--run-dir", str(run_dir), "--stall-timeout", "3", "--hang-limit", "10",
                                      "--no-auto", "--", sys.executable, "train.py"),
                       cwd=tmp_path, capture_output=True, text=True, timeout=120, env=_env())
    assert r.returncode == 124, r.stderr[-3000:]
    names = [f["name"] for f in read_status(run_dir)["findings"]]
    assert "run-hung" in names and "stall ended" not in r.stderr, (names, r.stderr[-3000:])
    assert "metrics server unreachable" in (run_dir / "output.log").read_text()


def test_a_launchers_dying_words_are_not_progress_but_training_lines_are() -> None:
    lines = ProgressLines()
    dying = [
        "W0102 10:00:01.500000 4242 torch/distributed/elastic/agent/server/api.py:700] Received 15 death signal,"
        " shutting down workers",
        "W0102 10:00:01.501000 4242 torch/distributed/elastic/multiprocessing/api.py:900] Sending process 4250"
        " closing signal SIGTERM",
        "[rank1]: Traceback (most recent call last):",
        '[rank1]:   File "/home/me/train.py", line 40, in <module>',
        "[rank1]:     loss.backward()",
        "[rank1]: RuntimeError: Connection closed by peer [127.0.0.1]:29500",
        "terminate called after throwing an instance of 'gloo::EnforceNotMet'",
        "  what():  [enforce fail at pair.cc:456] Received data size doesn't match expected size.",
        "Traceback (most recent call last):",
        '  File "/venv/bin/torchrun", line 8, in <module>',
        "    sys.exit(main())",
        "torch.distributed.elastic.multiprocessing.api.SignalException: Process 4242 got signal: 15",
        "/home/me/train.py:12: UserWarning: the metrics server is slow",
        '  warnings.warn("the metrics server is slow", UserWarning)',
        "KeyboardInterrupt",
        "==========================================",
        "train.py FAILED",
        "  exitcode  : -15 (pid: 4250)  (SIGTERM)",
        # torchrun's agent when its exit barrier times out (the other node's agent was lost)
        "[W1126 19:11:23.692403231 socket.cpp:494] [c10d] waitForInput: socket SocketImpl(fd=13) timed out after"
        " 300000ms",
        "Exception raised from sendBytes at /__w/pytorch/pytorch/torch/csrc/distributed/c10d/Utils.hpp:758 (most"
        " recent call first):",
        "frame #6: c10d::TCPStore::check(std::vector<std::string> const&) + 0x35d (0x7feca1b41acd in"
        " /venv/lib/python3.11/site-packages/torch/lib/libtorch_cpu.so)",
        "<omitting python frames>",
        # failures printed without a traceback (rules/signatures.py)
        "  what():  CUDA error: out of memory",
        "slurmstepd: error: *** JOB 4242 ON node1 CANCELLED AT 2024-01-01T00:00:00 DUE TO TIME LIMIT ***",
        "[rank3]: [E ProcessGroupNCCL.cpp:475] [Rank 3] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=9, OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600184 milliseconds before timing out.",
    ]
    assert [line for line in dying if lines.feed(line)] == []
    moving = ["step 40 loss 1.2031", "[rank0]: iter 41: loss 1.19, time 80.1ms",
              " 45%|####5     | 45/100 [00:09<00:11,  4.8it/s]", "Evaluating on the validation set..."]
    assert [line for line in moving if lines.feed(line)] == moving


# Stalls until trainguard has reported it, then takes a few quick steps and exits at once: the run ends
# before the watchdog's next look, as a slow rank's last steps, eval and checkpoint did in a new user's run.
RESUMES_THEN_ENDS = textwrap.dedent('''
    import os, sys, time
    from pathlib import Path
    status = Path(os.environ["TRAINGUARD_RUN_DIR"]) / "status.json"
    print("step 1 loss 0.52", flush=True)
    deadline = time.time() + 60
    while time.time() < deadline and "run-stalled" not in (status.read_text() if status.exists() else ""):
        time.sleep(0.1)  # a slow forward, past the stall timeout
    sys.stdout.write("step 2 loss 0.50\\nstep 3 loss 0.48\\nstep 4 loss 0.47\\n")
    sys.stdout.flush()
    os._exit(0)
''')


def test_a_stall_that_resumed_just_before_the_run_ended_is_closed_at_the_end(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(RESUMES_THEN_ENDS)
    run_dir = tmp_path / "run"
    r = subprocess.run(trainguard_cmd("run", "--run-dir", str(run_dir), "--stall-timeout", "2", "--no-auto",
                                      "--", sys.executable, "train.py"),
                       cwd=tmp_path, capture_output=True, text=True, timeout=120, env=_env())
    assert r.returncode == 0, r.stderr[-3000:]
    assert "step 4 loss" in (run_dir / "output.log").read_text()
    stalled = next(f for f in read_status(run_dir)["findings"] if f["name"] == "run-stalled")
    assert stalled["severity"] == "info", stalled
    assert stalled["evidence"]["stall_ended_by"] == "progress resumed", stalled
    assert "slow, not hung" in stalled["summary"] and "the stall ended after" in r.stderr, r.stderr[-3000:]
