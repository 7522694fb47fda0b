"""Who owns a live run, and whether that owner still exists.

A status.json that says `running` is only true while the process that writes it lives: `trainguard run`
(the watchdog), or the training script itself when it runs alone. Each writes `owner` (its pid and the
start time of that process) into status.json; a reader that finds the pid gone, or the pid reused by a
process that started at another time, knows the run ended without a word (a SIGKILL, a lost node).
"""

from __future__ import annotations

import os
import time
from typing import Any

from trainguard.contract import LIVE_STATES

GONE_STATE = "abandoned"  # what readers show instead of a live state whose owner is gone


def owner_record(pid: int | None = None) -> dict[str, Any]:
    """{"pid", "started"} for this process (or `pid`); `started` None where it cannot be read."""
    pid = os.getpid() if pid is None else pid
    return {"pid": pid, "started": _start_time(pid)}


def owner_alive(owner: dict[str, Any]) -> bool | None:
    """True/False when it can be told, None when the record says too little."""
    try:
        pid = int(owner["pid"])
    except (KeyError, TypeError, ValueError):
        return None
    if pid <= 0:
        return None
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # no such process; a number no pid can be
        return False
    except (PermissionError, OSError):
        pass  # someone else's process holds the pid: its start time decides
    if _zombie(pid):
        return False  # it exited; its parent (gone too, or never waiting) has not reaped it
    started = owner.get("started")
    now_started = _start_time(pid)
    if started is None or now_started is None:
        return True
    return abs(float(started) - now_started) < 1.0  # the same pid started at another time: reused


def check_owner(status: dict[str, Any]) -> dict[str, Any]:
    """The status as a reader must show it: a live state whose owner is gone becomes `abandoned`, with
    the recorded state and a note saying what is known."""
    state = status.get("state")
    if state not in LIVE_STATES or status.get("ended"):
        return status  # `ended` set: a final state (a hung run that was stopped), which no owner need keep true
    owner = status.get("owner")
    if not isinstance(owner, dict):
        # written before owners were recorded: the command's pid is all there is
        owner = {"pid": status.get("pid")} if status.get("pid") else None
    if status.get("watched_by") == "keeper" and status.get("pid") and owner_alive(
            {"pid": status["pid"], "started": status.get("command_started")}) is False:
        # The keeper only passes output on: alive, it says the command goes on unwatched. With the command
        # itself gone (a node whose watchdog and torchrun agent were killed, ranks left as orphans holding
        # the pipes), nothing runs the job any more and nobody will say how it ended.
        checked = dict(status)
        checked["recorded_state"] = state
        checked["state"] = GONE_STATE
        checked["state_note"] = (f"status.json says {state}, but its watchdog is gone and so is the command "
                                 f"(pid {status['pid']}): its exit is unknown; the output keeper (pid "
                                 f"{owner.get('pid') if owner else '?'}) still passes on what its processes print")
        return checked
    if owner is None or owner_alive(owner) is not False:
        return status
    checked = dict(status)
    checked["recorded_state"] = state
    checked["state"] = GONE_STATE
    who = "trainguard run" if status.get("watched_by") == "watchdog" else "the training process"
    if status.get("watched_by") == "keeper":
        who = "the output keeper"
    when = status.get("updated")
    since = f", last word at {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(when))}" if when else ""
    note = f"status.json says {state}, but its owner process is gone ({who}, pid {owner.get('pid')}{since})"
    command_pid = status.get("pid")
    if status.get("watched_by") in ("watchdog", "keeper") and command_pid:
        alive = owner_alive({"pid": command_pid, "started": status.get("command_started")})
        note += ("; the command (pid {}) is still running, unwatched" if alive
                 else "; the command (pid {}) is gone too, its exit is unknown").format(command_pid)
    checked["state_note"] = note
    return checked


def _zombie(pid: int) -> bool:
    try:
        import psutil

        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except Exception:
        return False


def _start_time(pid: int) -> float | None:
    try:
        import psutil

        return psutil.Process(pid).create_time()
    except Exception:
        return None


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
