"""The run's processes, as the watchdog finds and ends them: the command's process group, descendants that
left it (reparented to the watchdog, a child subreaper), their environments, the kernel's OOM kills, and
the signals the watchdog passes on to the group or ends it with.

All fail-open: psutil or /proc missing, a process gone between two reads, is an empty answer, never an
error (the verdict stands without it).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainguard.watchdog.scheduler import WARNING_SIGNALS, SlurmRun

KILL_GRACE = 3.0  # seconds between SIGTERM and SIGKILL when trainguard stops a run


def oom_kills() -> int | None:
    """The cgroup's OOM kills so far (None where it cannot be read)."""
    from trainguard.watchdog.kernel import cgroup_oom_kills

    return cgroup_oom_kills()


def oom_evidence(pid: int, before: int | None) -> dict[str, Any]:
    from trainguard.watchdog import kernel

    after = kernel.cgroup_oom_kills()
    log = kernel.kernel_log_tail()
    return {
        "oom_kills_before": before,
        "oom_kills_after": after,
        "oom_kills_delta": (after - before) if (after is not None and before is not None) else None,
        "kernel_lines": kernel.oom_lines_for(pid, log),
        "kernel_log_readable": log is not None,
    }


def become_subreaper() -> bool:
    """prctl(PR_SET_CHILD_SUBREAPER): a process of the run whose parent exits is reparented to the watchdog,
    whatever session or group it moved to, so a leftover that called setsid() is still found. Linux only;
    fail-open."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER = 36
    except (OSError, AttributeError):
        return False


def environ_of(pid: int) -> dict[str, str]:
    try:
        import psutil

        return dict(psutil.Process(pid).environ())
    except Exception:
        return {}


def orphans(keep: set[int | None], since: float) -> list[dict[str, Any]]:
    """The watchdog's own live descendants made since `since` (the attempt's start), other than `keep` (its
    keeper, what it had before): after the command exited, processes of the run reparented to it (see
    `become_subreaper`)."""
    try:
        import psutil

        out = []
        for child in psutil.Process().children(recursive=True):
            try:
                if child.pid in keep or child.status() == psutil.STATUS_ZOMBIE or child.create_time() < since - 1:
                    continue
                out.append({"pid": child.pid, "cmdline": child.cmdline()})
            except psutil.Error:
                continue
        return out
    except Exception:
        return []


def kill_all(pids: list[int]) -> None:
    """SIGTERM, a grace period, SIGKILL: for processes of the run outside its process group."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        if sig == signal.SIGTERM and pids:
            deadline = time.time() + KILL_GRACE
            while time.time() < deadline and any(alive(p) for p in pids):
                time.sleep(0.1)
    for pid in pids:  # ours since they were reparented: reaped here, not left as zombies
        try:
            os.waitpid(pid, os.WNOHANG)
        except OSError:
            pass


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        return done == 0
    except ChildProcessError:
        return True


def group_members(pgid: int) -> list[dict[str, Any]]:
    """Processes still in the command's process group (the command ran as its leader, in its own session)."""
    try:
        import psutil
    except ImportError:
        return []
    members = []
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if os.getpgid(proc.info["pid"]) == pgid:
                members.append({"pid": proc.info["pid"], "cmdline": proc.info["cmdline"]})
        except (ProcessLookupError, PermissionError, psutil.Error, OSError):
            continue
    return members


def terminate_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the command's process group, then SIGKILL whatever is left after a grace period."""
    pgid = proc.pid
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.time() + KILL_GRACE
    while time.time() < deadline and proc.poll() is None:
        time.sleep(0.1)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def forward_signals(pgid: int, scheduler: SlurmRun | None, run_dir: Path,
                    forwarded: Callable[[int], None]) -> dict[int, Any]:
    """The watchdog's ending signals (Ctrl-C, SIGTERM, SIGHUP) passed on to the command's process group,
    `forwarded(signum)` told first; under Slurm, its warnings handed to the scheduler. Returns the handlers
    replaced, for `restore_signals`."""
    old_handlers: dict[int, Any] = {}

    def forward(signum: int, frame: Any) -> None:
        if scheduler is not None:
            scheduler.on_signal(signum, run_dir)
        if signum in WARNING_SIGNALS and scheduler is not None:
            # a warning lets the run go on (to save): progress still counts, and only a process that
            # catches it gets it (one that does not would die of it)
            scheduler.pass_warning(signum, pgid)
            return
        forwarded(signum)
        try:
            os.killpg(pgid, signum)
        except ProcessLookupError:
            pass

    # under Slurm also sbatch --signal's warnings (unhandled, SIGUSR1 would end the watchdog itself)
    extra = WARNING_SIGNALS if scheduler is not None else ()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, *extra):
        try:
            old_handlers[sig] = signal.signal(sig, forward)
        except (ValueError, OSError):
            pass  # not the main thread (tests may run the supervisor in a thread)
    return old_handlers


def restore_signals(old_handlers: dict[int, Any]) -> None:
    for sig, handler in old_handlers.items():
        try:
            signal.signal(sig, handler)
        except (ValueError, OSError):
            pass
