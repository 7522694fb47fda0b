"""The kernel log followed while the run trains (issue 37), on the CPU, through real sources the tests can write:
a FIFO and a file named by TRAINGUARD_KERNEL_LOG (what a container without /dev/kmsg is pointed at), a child
command's output (the `journalctl -k -f` path), and a real `trainguard run` of a real torch training loop with
`watch()`, whose status.json must show the device findings while the run is alive. The lines are written in the
kernel's own formats: NVIDIA's `NVRM: Xid (PCI:dddd:bb:dd): N, pid=..., name=..., ...`, mm/oom_kill.c's
`%s: Killed process %d (%s) total-vm:...` and `oom-kill:...,task=%s,pid=%d,...`, kernel/hung_task.c's
`INFO: task %s:%d blocked for more than %ld seconds.`, each with dmesg's `[seconds.micros]` prefix.

    PYTHONPATH=src python -m pytest -p no:xdist -q tests/test_devices_kernel_log.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from tgtest import trainguard_cmd

from trainguard.devices.kmsg import JournalFollower, KernelLog, open_kernel_log

pytestmark = pytest.mark.process

XID79 = "[ 8812.204113] NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python, GPU has fallen off the bus.\n"
XID62 = ("[ 8813.000201] NVRM: Xid (PCI:0000:01:00): 62, 323f0f30 0000c3d8 00000000 206dae68 206da022 206da190\n")
OOM = ("[ 9001.117001] Memory cgroup out of memory: Killed process 5150 (pt_main_thread) total-vm:81723160kB, "
       "anon-rss:31337000kB, file-rss:120032kB, shmem-rss:0kB, UID:1000 pgtables:64012kB oom_score_adj:0\n"
       "[ 9001.117020] oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,"
       "oom_memcg=/job,task_memcg=/job,task=pt_main_thread,pid=5150,uid=1000\n")
HUNG = "[ 9120.500000] INFO: task pt_data_worker:777 blocked for more than 122 seconds.\n"
NOISE = "[ 9121.000000] eth0: Link is Up - 100Gbps/Full - flow control off\n"


def _drain(source: Any, want: int, timeout: float = 10.0) -> list[dict[str, Any]]:
    got: list[dict[str, Any]] = []
    end = time.monotonic() + timeout
    while len(got) < want and time.monotonic() < end:
        if source.wait(0.5):
            got += source.read()
    return got


def test_a_named_fifo_is_followed_line_by_line(tmp_path: Path) -> None:
    fifo = tmp_path / "kmsg.fifo"
    os.mkfifo(fifo)
    source = open_kernel_log({"TRAINGUARD_KERNEL_LOG": str(fifo)})
    assert isinstance(source, KernelLog) and not source.records
    w = os.open(fifo, os.O_WRONLY)
    try:
        assert source.read() == []  # nothing yet: non-blocking
        os.write(w, (NOISE + XID79[:40]).encode())  # half a line: it waits for its end
        assert source.read() == []
        os.write(w, (XID79[40:] + XID62 + OOM + HUNG).encode())
        got = _drain(source, 5)
    finally:
        os.close(w)
    assert [e["what"] for e in got] == ["xid", "xid", "oom-killer", "oom-killer", "hung-task"]
    xid79, xid62, oom, _, hung = got
    assert xid79["xid"] == 79 and xid79["pci"] == "0000:3b:00" and xid79["serious"] and xid79["pid"] == 4242
    assert xid62["xid"] == 62 and xid62["serious"] and xid62["pid"] is None
    assert oom["pid"] == 5150 and "pt_main_thread" in oom["text"]
    assert hung["pid"] == 777 and "122 s" in hung["text"]
    # a writer that went away is no end of the source: the next writer is read too
    w = os.open(fifo, os.O_WRONLY)
    os.write(w, HUNG.encode())
    os.close(w)
    assert [e["what"] for e in _drain(source, 1)] == ["hung-task"]
    source.close()


def test_a_named_file_is_followed_from_its_end(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text(XID79)  # the node's history, from before the run: not this run's
    source = open_kernel_log({"TRAINGUARD_KERNEL_LOG": str(log)})
    assert source is not None
    assert _drain(source, 1, timeout=1.5) == []
    with log.open("a") as fh:
        fh.write(NOISE + HUNG)
    assert [e["what"] for e in _drain(source, 1)] == ["hung-task"]
    source.close()


def test_off_when_told_or_when_the_named_source_is_missing(tmp_path: Path) -> None:
    assert open_kernel_log({"TRAINGUARD_KERNEL_LOG": "0"}) is None
    assert open_kernel_log({"TRAINGUARD_KERNEL_LOG": str(tmp_path / "absent")}) is None
    assert KernelLog.open(str(tmp_path / "absent")) is None


def test_a_follower_command_is_read_and_ended_on_close(tmp_path: Path) -> None:
    # the `journalctl -k -f` path, with a command the test can feed: `tail -F` of a file it appends to
    log = tmp_path / "journal.txt"
    log.write_text("")
    source = JournalFollower.open(["tail", "-n", "0", "-F", str(log)])
    assert source is not None
    time.sleep(0.5)  # tail opens the file
    with log.open("a") as fh:
        fh.write(OOM.replace("[ 9001.117001] ", "").replace("[ 9001.117020] ", "") + XID79)
    got = _drain(source, 3)
    assert [e["what"] for e in got] == ["oom-killer", "oom-killer", "xid"]
    source.close()
    assert source.proc.poll() is not None
    _group_gone(source.proc.pid)  # no child left behind: the shell's group, `tail` in it


def test_a_follower_command_ends_when_its_process_dies_without_closing_it(tmp_path: Path) -> None:
    script = ("import os, sys; from trainguard.devices.kmsg import JournalFollower\n"
              "f = JournalFollower.open(['sleep', '300']); print(f.proc.pid, flush=True); os._exit(0)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    _group_gone(int(out.stdout.split()[0]))


def _group_gone(pgid: int) -> None:
    """The process group ends within seconds (a killed member stays a zombie until init reaps it)."""
    end = time.monotonic() + 10
    while time.monotonic() < end:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    os.killpg(pgid, 9)
    raise AssertionError("the follower command outlived the process that started it")


TRAIN = textwrap.dedent('''
    import os, sys, time, torch, trainguard
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    guard = trainguard.watch(model, opt)
    w = torch.randn(32, 1)
    t_end = time.time() + float(sys.argv[1])
    while time.time() < t_end and not os.path.exists("stop"):
        x = torch.randn(16, 32)
        loss = (model(x) - x @ w).pow(2).mean()
        opt.zero_grad(); loss.backward(); opt.step(); guard.step(loss)
        time.sleep(0.05)
    guard.finish()
''')


def _status(run_dir: Path) -> dict[str, Any]:
    try:
        return json.loads((run_dir / "status.json").read_text())
    except (OSError, ValueError):
        return {}


def _wait_for(proc: subprocess.Popen[str], run_dir: Path, cond: Any, timeout: float) -> dict[str, Any]:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        status = _status(run_dir)
        if cond(status):
            return status
        assert proc.poll() is None, f"the run ended first: {proc.communicate()[1][-3000:]}"
        time.sleep(0.25)
    raise AssertionError(f"not within {timeout} s: {json.dumps(_status(run_dir))[:3000]}")


def _codes(status: dict[str, Any]) -> list[str]:
    return [f["code"] for f in status.get("findings") or []]


@pytest.mark.parametrize("how", ["trainguard run", "watch() alone"])
def test_device_findings_reach_status_json_while_the_run_trains(workdir: Path, how: str) -> None:
    # under `trainguard run` the watchdog's rules read the store; alone, the probe's own rules (InboxRules)
    (workdir / "train.py").write_text(TRAIN)
    fifo = workdir / "kmsg.fifo"
    os.mkfifo(fifo)
    env = {**os.environ, "TRAINGUARD_KERNEL_LOG": str(fifo)}
    env.pop("TRAINGUARD_RUN_DIR", None)
    if how == "trainguard run":
        cmd = trainguard_cmd("run", "--quiet", "--run-dir", "run", "--", sys.executable, "train.py", "150")
    else:
        cmd = [sys.executable, "train.py", "150"]
        env["TRAINGUARD_RUN_DIR"] = str(workdir / "run")
    proc = subprocess.Popen(cmd, cwd=workdir, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    w = os.open(fifo, os.O_RDWR)  # (never blocks; the probe holds its own end)
    try:
        run = workdir / "run"
        _wait_for(proc, run, lambda s: (s.get("step") or 0) >= 5, 90)
        os.write(w, HUNG.encode())
        planted = time.monotonic()
        status = _wait_for(proc, run, lambda s: "TG572" in _codes(s), 30)
        seconds = time.monotonic() - planted
        note = next(f for f in status["findings"] if f["code"] == "TG572")
        assert note["severity"] == "info" and "pt_data_worker (pid 777)" in note["summary"]
        assert status["state"] == "running" and status.get("health") == "ok", status  # a note, not a warning
        assert seconds < 15, f"TG572 took {seconds:.1f} s"
        os.write(w, XID79.encode())
        status = _wait_for(proc, run, lambda s: "TG571" in _codes(s), 30)
        fault = next(f for f in status["findings"] if f["code"] == "TG571")
        assert fault["severity"] == "error" and "Xid 79 (GPU has fallen off the bus)" in fault["summary"]
        assert status["state"] == "running"
        (workdir / "stop").write_text("")
        proc.communicate(timeout=90)
    finally:
        os.close(w)
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    final = _status(workdir / "run")
    assert final["state"] == "completed", final
    assert _codes(final).count("TG572") == 1 and _codes(final).count("TG571") == 1, _codes(final)


def test_a_healthy_run_with_a_quiet_kernel_log_has_no_device_finding(workdir: Path) -> None:
    (workdir / "train.py").write_text(TRAIN)
    fifo = workdir / "kmsg.fifo"
    os.mkfifo(fifo)
    env = {**os.environ, "TRAINGUARD_KERNEL_LOG": str(fifo)}
    env.pop("TRAINGUARD_RUN_DIR", None)
    r = subprocess.run(trainguard_cmd("run", "--quiet", "--run-dir", "run", "--", sys.executable, "train.py", "8"),
                       cwd=workdir, env=env, capture_output=True, text=True, timeout=150)
    final = _status(workdir / "run")
    assert final.get("state") == "completed", r.stderr[-3000:]
    assert (final.get("step") or 0) > 20
    assert not [c for c in _codes(final) if c.startswith("TG57")], final["findings"]
    from trainguard.store.reader import RunReader

    with RunReader(workdir / "run") as reader:
        assert reader.events("device") == []


def test_the_ring_buffer_fallback_parses_only_what_came_after_its_first_read() -> None:
    # syslog(2)'s READ_ALL gives the whole ring buffer each time (`<level>[seconds] message` lines); a buffer
    # that wrapped has lost the line last seen. The kernel's side is played by a function filling the buffer.
    import ctypes

    from trainguard.devices.kmsg import SyslogBuffer

    ring = [b"<6>" + NOISE.encode(), b"<4>" + XID79.encode()]

    def klogctl(action: int, buf: Any, size: int) -> int:
        data = b"".join(ring)[-size:]
        ctypes.memmove(buf, data, len(data))
        return len(data)

    source = SyslogBuffer(klogctl, 1 << 16)
    assert source.read() == []  # the buffer's history, from before the run
    ring.append(b"<3>" + HUNG.encode())
    assert [e["what"] for e in source.read()] == ["hung-task"]
    assert source.read() == []  # nothing new
    ring[:] = [b"<3>" + OOM.encode()]  # wrapped: the last line seen is gone; what is there is new
    assert [e["what"] for e in source.read()] == ["oom-killer", "oom-killer"]
