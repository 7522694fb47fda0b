"""The output keeper: what keeps a command alive and heard when `trainguard run` itself is killed.

    python -m trainguard.watchdog.keeper WATCHDOG_PID RUN_DIR STDOUT_FD STDERR_FD [--no-echo]

The command writes into pipes that the watchdog reads. Were the watchdog SIGKILLed (the OOM killer, a
`kill -9`, a lost terminal), the next print of the command would die of a broken pipe, and a full pipe
would freeze it: the guard would become the failure. So each attempt gets a keeper, a small process that
holds the read ends of the same pipes and does nothing while its parent, the watchdog, lives. When the
watchdog is gone, the keeper takes over: it passes the output on to the terminal and to output.log until
the command closes its pipes, and says in status.json that the run goes on unwatched (stalls are no
longer judged, nothing is stopped). The policy, in one line: a dead watchdog never stops the training.

The watchdog stops its keeper when the attempt ends (SIGTERM).
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

from trainguard.findings import Finding

PARENT_POLL = 0.2  # seconds between checks that the watchdog still lives (a full pipe waits at most this)


def start(run_dir: Path, stdout_fd: int, stderr_fd: int, echo: bool, lock_fd: int = -1) -> subprocess.Popen | None:
    """Starts the keeper of one attempt; fail-open (None) where it cannot be started. `lock_fd`, the run
    folder's lock (store/lock.py), is inherited: the folder stays owned while the keeper keeps the command."""
    cmd = [sys.executable, "-m", "trainguard.watchdog.keeper", str(os.getpid()), str(run_dir),
           str(stdout_fd), str(stderr_fd)]
    if not echo:
        cmd.append("--no-echo")
    fds = (stdout_fd, stderr_fd) + ((lock_fd,) if lock_fd >= 0 else ())
    try:
        return subprocess.Popen(cmd, pass_fds=fds, stdin=subprocess.DEVNULL)
    except OSError:
        return None


def stop(keeper: subprocess.Popen | None) -> None:
    if keeper is None:
        return
    try:
        keeper.terminate()
        keeper.wait(timeout=2.0)
    except Exception:
        try:
            keeper.kill()
        except OSError:
            pass


def main(argv: list[str]) -> int:
    watchdog_pid, run_dir, out_fd, err_fd = int(argv[0]), Path(argv[1]), int(argv[2]), int(argv[3])
    echo = "--no-echo" not in argv
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_IGN)  # a Ctrl-C is the watchdog's to forward; a lost terminal is not ours
    while os.getppid() == watchdog_pid:
        time.sleep(PARENT_POLL)
    t_gone = time.time()
    _mark_unwatched(run_dir, watchdog_pid, t_gone)
    sinks = {out_fd: _buffer(sys.stdout) if echo else None, err_fd: _buffer(sys.stderr) if echo else None}
    try:
        from trainguard.folderio import open_append

        log = os.fdopen(open_append(run_dir / "output.log"), "ab")
    except OSError:
        log = None
    _write(log, f"\n[trainguard: the watchdog (pid {watchdog_pid}) is gone; output kept by pid {os.getpid()}]\n"
           .encode())
    open_fds = [out_fd, err_fd]
    while open_fds:
        ready, _, _ = select.select(open_fds, [], [])
        for fd in ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                chunk = b""
            if not chunk:
                open_fds.remove(fd)
                continue
            _write(log, chunk)
            _write(sinks[fd], chunk)
    _mark_ended(run_dir, watchdog_pid, t_gone)
    return 0


def _write(sink: IO[bytes] | None, data: bytes) -> None:
    if sink is None:
        return
    try:
        sink.write(data)
        sink.flush()
    except (OSError, ValueError):
        pass  # a full disk or a closed terminal costs that copy of the output, never the command


def _buffer(stream: Any) -> Any:
    return getattr(stream, "buffer", None)


def _mark_unwatched(run_dir: Path, watchdog_pid: int, t_gone: float) -> None:
    from trainguard.store.owner import owner_record

    _update(run_dir, lambda st: {
        **st, "watched_by": "keeper", "owner": owner_record(),
        "state_note": f"trainguard run (pid {watchdog_pid}) was killed at {_clock(t_gone)}: the command goes on "
                      f"unwatched (no stall judged, nothing stopped); its output still goes to output.log",
        "updated": time.time()})


def _mark_ended(run_dir: Path, watchdog_pid: int, t_gone: float) -> None:
    # The keeper is not the command's parent and cannot learn its exit code; what the command's probe
    # recorded in run.db can still say how it ended (`ending_from_store`): its finish(), its crash, the
    # step it reached. Without such facts the run is not known to have completed, and status.json says so.
    from trainguard.store.ending import ending_status

    facts = ending_from_store(run_dir)
    when = (f"trainguard run (pid {watchdog_pid}) was killed at {_clock(t_gone)}; the command went on unwatched "
            f"and closed its output at {_clock(time.time())}")

    def change(st: dict[str, Any]) -> dict[str, Any]:
        findings = [f for f in st.get("findings") or [] if isinstance(f, dict)]
        findings += [f.to_dict() for f in facts.findings]
        fields = {k: v for k, v in st.items() if k not in ("state", "exit_code", "signal")}
        if facts.step is not None:
            fields["step"] = facts.step
        return {**fields, **ending_status(
            facts.ending, reason="watchdog-gone", ended=time.time(), updated=time.time(), findings=findings,
            state_note=f"{when}; {facts.note} (see output.log and `trainguard report`)")}

    _update(run_dir, change, final=True)


class StoreEnding:
    """What run.db says of an ending nobody watched: the Ending, the step reached, findings, a note."""

    def __init__(self, ending: Any, step: int | None, findings: list[Any], note: str) -> None:
        self.ending, self.step, self.findings, self.note = ending, step, findings, note


def ending_from_store(run_dir: Path) -> StoreEnding:
    """The ending of an unwatched command from its probe's record in run.db (the last attempt's): a crash
    event makes it crashed (with its TG501), `probe finish` completed (its exit code unknown), a probe that
    recorded steps but never finished failed with a TG506 that says so; no probe record at all: failed,
    how unknown."""
    from trainguard.contract import EVENT_CRASH, EVENT_PROBE
    from trainguard.rules.crash import crash_finding
    from trainguard.rules.ending import PROBE_NOT_FINISHED
    from trainguard.store.ending import Ending
    from trainguard.store.reader import RunReader

    unknown = StoreEnding(Ending(exit_unknown=True), None, [],
                          "its exit code is unknown and its probe recorded nothing of its end")
    try:
        with RunReader(run_dir) as reader:
            events = reader.events()
            last = reader.last_step()
            plan = reader.meta().get("plan") or {}
    except Exception:  # a store that cannot be read: the facts are unknown, said as such
        return unknown
    attempts = [e["attempt"] for e in events if e["kind"] in (EVENT_PROBE, EVENT_CRASH)]
    if not attempts and last is None:
        return unknown
    attempt = max(attempts, default=last["attempt"] if last else 0)
    mine = [e for e in events if e["attempt"] == attempt]
    step = last["step"] if last and last.get("attempt") == attempt else None
    crash = next((e for e in reversed(mine) if e["kind"] == EVENT_CRASH and isinstance(e["data"], dict)), None)
    if crash is not None:
        d = crash["data"]
        frames = [f for f in d.get("frames") or [] if isinstance(f, dict) and {"file", "line", "function"} <= set(f)]
        finding = crash_finding(exception=str(d.get("exception") or crash.get("name") or "?"),
                                message=str(d.get("message") or ""), frames=frames,
                                step=crash["step"] if crash["step"] is not None else step, source="keeper")
        return StoreEnding(Ending(crashed=True, probe_used=True), step, [finding],
                           "its probe recorded an uncaught exception; its exit code is unknown")
    if any(e["kind"] == EVENT_PROBE and e["name"] == "finish" for e in mine):
        return StoreEnding(Ending(probe_used=True, probe_finished=True), step, [],
                           f"its probe recorded finish() at step {step}: the script reached its end "
                           f"(its exit code is unknown)")
    total = plan.get("total_steps") if isinstance(plan.get("total_steps"), int) else None
    at = f" at step {step}" if step is not None else ""
    finding = Finding.of(
        PROBE_NOT_FINISHED, step=step, source="keeper",
        summary=f"the command ended unwatched{at} (its watchdog had been killed) without its probe reaching "
                f"guard.finish(): its end was never confirmed",
        evidence={"step": step, "total_steps": total, "watchdog": "killed"},
        fix="Read the end of output.log for how it ended; resume from the last checkpoint if it stopped early. "
            "Keep `trainguard run` alive for the run's length (a job step of its own, not a login shell).")
    return StoreEnding(Ending(exit_unknown=True, probe_used=True), step, [finding],
                       "its probe recorded no finish(), and its exit code is unknown")


def _update(run_dir: Path, change: Any, final: bool = False) -> None:
    from trainguard.contract import LIVE_STATES, STATUS_NAME
    from trainguard.errors import UserError
    from trainguard.store.status import write_status

    try:
        from trainguard.folderio import read_capped
        from trainguard.store.status import MAX_STATUS_BYTES

        status = json.loads(read_capped(run_dir / STATUS_NAME, MAX_STATUS_BYTES, "status.json"))
        if not isinstance(status, dict) or status.get("state") not in LIVE_STATES:
            return  # the watchdog said its last word before it went
        write_status(run_dir, change(status), final=final)
    except (OSError, ValueError, UserError):
        pass


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
