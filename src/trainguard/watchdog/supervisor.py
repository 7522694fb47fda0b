"""`trainguard run`: start the command, watch it, and tell the true final state.

    trainguard run [--run-dir DIR] [--stall-timeout S] [--hang-limit S] [--expect PATH ...] -- python train.py

The supervisor starts the command in its own process group (so the whole tree can be signalled), tees
its output into the run folder, and every half second reads the probe's heartbeat and steps from the
store, updates status.json and the live status line, and asks its monitors (stall detection; the rules
add theirs) for findings. When the process ends, `verdict.decide` names the state.

A stall (no progress for the stall timeout) is a finding at once; the run is stopped only on proof that it
cannot recover or past the stall's limit (watchdog/stop.py). Until then trainguard keeps looking.
"""

from __future__ import annotations

import getpass
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from trainguard import __version__, exitcodes
from trainguard.contract import (
    ENV_ATTEMPT,
    ENV_RESUME_FROM,
    ENV_RUN_DIR,
    ENV_STACKS,
    ENV_WATCHDOG,
    EVENT_CHECKPOINT,
    EVENT_CHECKPOINT_CHECK,
    EVENT_DEVICE,
    EVENT_DEVICE_SAMPLE,
)
from trainguard.errors import UserError
from trainguard.findings import Finding, most_severe_first
from trainguard.rules import crash
from trainguard.rules.ending import RUN_KILLED
from trainguard.rules.firstfailure import first_failure_finding
from trainguard.rules.killedrank import killed_rank_finding
from trainguard.store import lock as run_lock
from trainguard.store.acks import read_acks
from trainguard.store.ending import Ending, ending_status, live_status
from trainguard.store.nodes import node_dir
from trainguard.store.owner import owner_record
from trainguard.store.paths import new_run_dir, prepare_run_dir, runs_root
from trainguard.store.reader import RunReader
from trainguard.store.selflog import GuardLog
from trainguard.store.status import BAD_ENDS, reserve_space, write_status
from trainguard.store.writer import StoreWriter
from trainguard.untrusted import printable
from trainguard.watchdog import keeper, nodes, rendezvous, restart, statusline, stop, verdict
from trainguard.watchdog.scheduler import WARNING_SIGNALS, SlurmRun
from trainguard.watchdog.stall import (
    RUN_HUNG,
    RUN_STALLED,
    Stall,
    StallPolicy,
    hang_finding,
    stall_ended,
    stalled_finding,
)
from trainguard.watchdog.tee import OutputCapture
from trainguard.watchdog.writes import WriteWatch

if TYPE_CHECKING:
    from trainguard.contract import State

POLL_INTERVAL = 0.5
MAX_IO_GRACE = 5  # stalls forgiven in a row because the run was still writing or importing
KILL_GRACE = 3.0  # seconds between SIGTERM and SIGKILL when trainguard stops a run
WATCHDOG_RANK = -1  # rows the watchdog writes carry rank -1
FAIL_ON_EXIT = exitcodes.HEALTH  # a completed run whose unacknowledged findings reach --fail-on's severity
RELOOK_MIN, RELOOK_MAX = 5.0, 300.0  # seconds between looks at an open stall (the stall timeout, within these)
# A line that shows a training step's loss: for a script without the probe, the end of its start-up.
_LOSS_LINE = re.compile(r"(?i)\bloss\b['\"]?\s*[:=]?\s*[-+]?(\d|nan|inf)")


@dataclass
class OpenStall:
    """A stall reported as run-stalled and still going on: what the looks at it saw so far."""

    finding: Finding
    since: float  # the last progress before it
    mark: float  # the progress mark it is measured against (progress past it ends the stall)
    looks: list[Any]
    next_look: float


@dataclass
class WatchState:
    """What a monitor may look at on each poll. This is the whole surface monitors get."""

    run_dir: Path
    reader: RunReader
    pid: int
    started: float
    now: float
    step: int | None
    phase: str | None
    t_progress: float | None
    probe_used: bool
    output_lines: int
    last_output: float | None
    attempt: int = 0
    scratch: dict[str, Any] = field(default_factory=dict)


class Monitor(Protocol):
    """Something the supervisor polls while the run lives; returns new findings (may be empty).

    A monitor must return quickly (it runs on the supervisor's loop) and must not raise for the run's
    sake: the supervisor logs and drops a monitor that raises.
    """

    def poll(self, state: WatchState) -> list[Finding]: ...


@dataclass
class RunOptions:
    command: list[str]
    run_dir: str | None = None
    stall_timeout: float | None = None
    hang_limits: dict[str, float] = field(default_factory=dict)  # --hang-limit: {phase or "*": seconds}
    expects: list[str] = field(default_factory=list)
    stop_on: list[str] = field(default_factory=list)
    fail_on: str | None = None  # "error" | "warning": a completed run with such findings exits FAIL_ON_EXIT
    # (the CLI's default is "error"; None and "never": the command's own code)
    notify: list[str] = field(default_factory=list)  # the notifiers' targets, masked, for the run's meta
    on_hang: str = "kill"  # wait | kill | restart
    max_restarts: int = 3  # with on_hang="restart": restarts at most; a repeated hang stops sooner
    live: bool | None = None  # None: a live status line only when stderr is a terminal
    echo: bool = True
    cwd: str | None = None  # where the command runs (default: here); preflight runs it in a scratch folder
    env: dict[str, str] = field(default_factory=dict)  # extra environment, applied last (e.g. a resume path)


def check_command(command: list[str]) -> None:
    if not command:
        raise UserError("no command given: trainguard run [OPTIONS] -- COMMAND [ARGS...]")
    exe = command[0]
    if os.sep in exe:
        try:
            os.stat(exe)
        except FileNotFoundError:
            raise UserError(f"command not found: {exe}") from None
        except OSError:
            return  # not ours to look at (a link into a home we may not read): starting it will tell
        if not os.access(exe, os.X_OK):
            raise UserError(f"command is not executable: {exe}")
    elif shutil.which(exe) is None:
        raise UserError(f"command not found: {exe}")


class Supervisor:
    def __init__(self, options: RunOptions, monitors: list[Monitor] | None = None,
                 report: Callable[[Path], tuple[Path, Path]] | None = None) -> None:
        """`monitors` are polled while the run lives; `report(run_dir)`, given by the command (the report
        is a room above the watchdog), writes report.md and report.html once the run has ended."""
        check_command(options.command)
        self.forwarded: int | None = None  # the last ending signal trainguard passed on to the command
        self.options = options
        self.write_report = report
        if options.stall_timeout is not None and options.stall_timeout <= 0:
            raise UserError(f"--stall-timeout must be a positive number of seconds, got {options.stall_timeout}")
        label = _label(options.command)
        # under Slurm, the job's own folder: a requeued job continues it as its next attempt
        self.scheduler = SlurmRun.detect()
        if options.run_dir:
            self.run_dir = prepare_run_dir(options.run_dir)
        elif self.scheduler is not None:
            self.run_dir = prepare_run_dir(runs_root() / self.scheduler.folder_name(label))
        else:
            self.run_dir = new_run_dir(label)
        # one `trainguard run` per node of a torchrun job: this node's part in RUN/node-<N>/, and a beat
        # through the rendezvous store so the other nodes know it lives (watchdog/nodes.py)
        launch = nodes.parse_launch(options.command)
        if launch is not None:
            self.run_dir = prepare_run_dir(node_dir(self.run_dir, launch.node))
        elif self.scheduler is not None and self.scheduler.node_part() is not None:
            self.run_dir = prepare_run_dir(node_dir(self.run_dir, self.scheduler.node_part() or 0))
        # the run owns its folder for its life: a second run into it is refused; an earlier, ended run
        # found in it is moved into earlier-<N>/ first (store/lock.py), except the same Slurm job's earlier
        # attempt, which a requeued job continues
        requeued = self.scheduler is not None and self.scheduler.attempt > 0
        self.lock = run_lock.claim(self.run_dir, command=options.command, keep_apart=not requeued)
        if self.lock.moved_to is not None and options.echo:
            print(f"trainguard: the earlier run in {self.run_dir} was moved to {self.lock.moved_to}",
                  file=sys.stderr)
        try:
            self.writer = StoreWriter(self.run_dir, rank=WATCHDOG_RANK)
        except Exception as exc:  # sqlite3.OperationalError on an unwritable folder, and its kin
            raise UserError(f"cannot write the run store in {self.run_dir}: {exc}") from None
        self.stall = StallPolicy(fixed=options.stall_timeout)
        self.monitors: list[Monitor] = list(monitors or [])
        if launch is not None:
            self.monitors.append(nodes.NodeWatch(launch, self.run_dir))
        # a start-up that waits in its rendezvous for ranks or nodes never started, said at once (TG712)
        self.monitors.append(rendezvous.RendezvousWatch(self.run_dir))
        time_monitor = self.scheduler.monitor() if self.scheduler is not None else None
        if time_monitor is not None:
            self.monitors.append(time_monitor)
        self.findings: list[Finding] = []
        self._seen: set[tuple] = set()
        self.live = sys.stderr.isatty() if options.live is None else options.live
        self.attempt = self.scheduler.attempt if self.scheduler is not None else 0

    # -- the run ----------------------------------------------------------------------------------

    def run(self) -> int:
        _become_subreaper()  # orphans of the command (a daemon that called setsid()) come to us, not to init
        self.started = time.time()
        self._t0 = time.monotonic()  # durations: a clock set back mid-run must not make them negative
        self._write_meta()
        reserve_space(self.run_dir)  # so the last status.json is written even if the run fills the disk
        self.capture = OutputCapture(self.run_dir / "output.log", echo=self.options.echo)
        self.line = statusline.StatusLine(enabled=self.live)
        self.capture.before_write = self.line.clear
        self.capture.note_sink = _buffer(sys.stderr)
        try:
            return self._run_attempts()
        except BaseException as exc:
            # The watchdog itself failed: never leave the command running unwatched, nor a status.json that
            # says "running" forever.
            self._emergency_stop(exc)
            raise

    def _emergency_stop(self, exc: BaseException) -> None:
        if getattr(self, "proc", None) is not None:
            self._terminate()  # the whole group: the main process may be gone while its children live
        self._guard_error(f"watchdog failed, command stopped: {type(exc).__name__}: {exc}")
        try:
            status = ending_status(
                Ending(stopped=True), step=None, phase=None, updated=time.time(), watched_by="watchdog",
                state_note=f"the watchdog itself failed ({type(exc).__name__}: {exc}) and stopped the command",
                findings=[f.to_dict() for f in self.findings])
            write_status(self.run_dir, status, final=True)
        except Exception:
            pass

    def _run_attempts(self) -> int:
        policy = restart.RestartPolicy(self.options.on_hang, self.options.max_restarts)
        resume: str | None = None
        while True:
            returncode, hang, stopped = self._attempt(resume)
            if hang is None:
                break
            resume_from, why = self._resume_choice()
            decision = policy.after_hang(hang, resume_from)
            if decision.restart:
                self._note(f"trainguard: {why}")
            if decision.finding is not None:
                self._report(decision.finding)
            if decision.note:
                self._note(f"trainguard: {decision.note}")
            if not decision.restart:
                break
            self.writer.add_event("run", "restart", {"attempt": self.attempt + 1, "resume_from": decision.resume_from,
                                                     "after": hang.to_dict()})
            self.writer.flush()
            self.attempt += 1
            resume = decision.resume_from
        self.capture.join()
        return self._conclude(returncode, hang, stopped)

    def _resume_choice(self) -> tuple[str | None, str]:
        """The newest checkpoint verified good (checkpoints/resume.py), once the verifications in flight ended."""
        from trainguard.checkpoints.resume import resume_choice

        for mon in self.monitors:
            settle = getattr(mon, "settle", None)
            if settle is not None:
                try:
                    settle()
                except Exception as exc:
                    self._guard_error(f"monitor {type(mon).__name__} failed to settle: {exc!r}")
        return resume_choice(self.reader.events(EVENT_CHECKPOINT), self.reader.events(EVENT_CHECKPOINT_CHECK))

    def _attempt(self, resume: str | None) -> tuple[int, Finding | None, Finding | None]:
        """One run of the command, to its end or to a hang; returns (exit code, hang, stopped-on)."""
        self.attempt_started = time.time()
        self.stall = StallPolicy(fixed=self.options.stall_timeout)
        self.limits = stop.StopLimits(user=dict(self.options.hang_limits))
        self._liveness: float | None = None  # a slow save that keeps moving counts as progress
        self._io_graces = 0
        self._open: OpenStall | None = None
        self._looks = 0
        self._phase_events_seen = 0
        self._loss_line_seen = False
        self._lines_scanned = 0
        self._signalled: float | None = None  # when a signal went to the command (the user's, or our stop)
        self._progress_before_signal: float | None = None
        self.capture.deaf_from = None
        self.writes = WriteWatch(self.run_dir)
        if self.scheduler is not None:
            self.scheduler.clear_stop_request(self.run_dir)
        env = dict(os.environ)
        env.update({ENV_RUN_DIR: str(self.run_dir.resolve()), ENV_WATCHDOG: "1", ENV_ATTEMPT: str(self.attempt),
                    "PYTHONUNBUFFERED": "1"})
        env.pop(ENV_RESUME_FROM, None)
        # a stacks folder inherited from a watched caller (a notebook, a test runner, an outer run) is that
        # run's: this run's processes dump into its own, which the bootstrap makes from ENV_RUN_DIR
        env.pop(ENV_STACKS, None)
        env.update(self.options.env)
        if resume:
            env[ENV_RESUME_FROM] = resume
        self._children_before = {m["pid"] for m in _orphans(keep=set(), since=0.0)}  # not the run's (in-process callers)
        try:
            self.proc = subprocess.Popen(
                self.options.command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                start_new_session=True, cwd=self.options.cwd,
            )
        except OSError as exc:
            raise UserError(f"cannot start {self.options.command[0]}: {exc.strerror or exc}") from None
        self._command_started = owner_record(self.proc.pid)["started"]
        self.writer.add_event("run", "start", {"pid": self.proc.pid, "command": self.options.command,
                                               "attempt": self.attempt, "resume_from": resume})
        self.writer.flush()
        stdout, stderr = self.proc.stdout, self.proc.stderr
        assert stdout is not None and stderr is not None  # both are pipes (Popen above)
        self.capture.start(stdout, "stdout", _buffer(sys.stdout))
        self.capture.start(stderr, "stderr", _buffer(sys.stderr))
        # if this process is killed, the keeper passes the output on: the command never dies of a broken pipe
        self._keeper = keeper.start(self.run_dir, stdout.fileno(), stderr.fileno(),
                                    self.options.echo, lock_fd=self.lock.fd)
        self._forward_signals()
        self.oom_before = _safe_oom()
        if not hasattr(self, "reader"):
            self.reader = RunReader(self.run_dir)
        hang: Finding | None = None
        stopped: Finding | None = None
        try:
            while self.proc.poll() is None:
                time.sleep(POLL_INTERVAL)
                state = self._observe()
                self._scratch = state.scratch
                acks = read_acks(self.run_dir) if self.options.stop_on else {}
                for finding in self._poll_monitors(state):
                    self._report(finding)
                    if finding.name in self.options.stop_on and stopped is None and finding.code not in acks:
                        stopped = finding
                        self._note(f"stopping the run on {finding.name} (--stop-on)")
                        self._terminate()
                if state.t_progress and self._liveness and state.t_progress > self._liveness:
                    self._io_graces = 0  # real progress again: the slow save finished
                if hang is None and stopped is None and self.proc.poll() is None:
                    hang = self._watch_stall(state)
                    if hang is not None:
                        if self.options.on_hang == "wait":
                            self._write_status("hung", state, findings_extra=[hang])
                            self._wait_forever_on_hang(state)
                        self._terminate()
                self._write_status("running" if hang is None else "hung", state)
                self.line.show(state, self.options, self.stall.timeout(state.phase), self.findings, self.run_dir)
        finally:
            self.line.clear()
            self._restore_signals()
        returncode = self.proc.wait()
        members = _group_members(self.proc.pid)
        # a descendant that left the group with setsid() was reparented to us (a child subreaper, see
        # `run`) when its parent exited: still the run's, found among our own children
        escaped = [m for m in _orphans(keep={getattr(self._keeper, "pid", None)} | self._children_before,
                                       since=self.attempt_started)
                   if m["pid"] not in {x["pid"] for x in members} and self._of_this_run(m["pid"])]
        if members or escaped:
            step = max((b["step"] for b in self.reader.heartbeats() if b["step"] is not None), default=None)
            self._report(verdict.leftover_finding(members + escaped, step))
            self._terminate()
            _kill_all([m["pid"] for m in escaped])
        self.capture.drain()
        self._close_stall_at_end(returncode)
        keeper.stop(self._keeper)
        return returncode, hang, stopped

    def _of_this_run(self, pid: int) -> bool:
        """A process the command started (its environment names this run and attempt, as the command's own),
        not one the watchdog started for itself (a sink's service such as wandb-core, a checkpoint verifier,
        a notifier's command), which are its children too."""
        env = _environ_of(pid)
        return (env.get(ENV_RUN_DIR) == str(self.run_dir.resolve())
                and env.get(ENV_ATTEMPT) == str(self.attempt))

    def _observe(self) -> WatchState:
        beats = [b for b in self.reader.heartbeats() if b["attempt"] == self.attempt]
        t_progress = max((b["t_progress"] for b in beats if b["t_progress"]), default=None)
        probe_starts = [e["t"] for e in self.reader.events("probe") if e["attempt"] == self.attempt]
        probe_used = bool(beats) or bool(probe_starts)
        # Until the first optimizer step the run is starting up (data preparation, a first batch,
        # `torch.compile`, NCCL set-up can take minutes), whatever it prints before: the startup timeout
        # holds, nothing is learned, and its stop limit is that of a phase never seen. Without the probe,
        # the first printed loss ends it.
        if probe_used:
            startup = not any(b["step"] for b in beats)
        else:
            startup = not self._printed_a_loss()
        if t_progress is None and probe_starts:
            # The probe started (imports and model building are done) but no heartbeat came yet: a process
            # that then froze with the GIL held (a C call that blocks) never writes one.
            t_progress = max(probe_starts)
        step = max((b["step"] for b in beats if b["step"] is not None), default=None)
        phase = next((b["phase"] for b in beats if b["rank"] == 0 and b["phase"]), None)
        # Progress the user does not have to mark: output lines (not tracebacks, warnings or a launcher's
        # dying words: watchdog/dying.py), and bytes the run writes to its files.
        others = (self.capture.last_progress, self._safe_writes())
        t_progress = max((t for t in (t_progress, *others) if t is not None), default=None)
        if self._signalled is None:
            self._progress_before_signal = t_progress
        else:
            # Once a signal was sent, whatever the processes print or write is their dying (a traceback,
            # torchrun's "Sending process N closing signal", a save on SIGTERM), never "progress resumed".
            t_progress = self._progress_before_signal
        self._learn_phases()
        closed = self.writes.take_closed() if hasattr(self, "writes") else []
        state = WatchState(
            run_dir=self.run_dir, reader=self.reader, pid=self.proc.pid, started=self.started, now=time.time(),
            step=step, phase=phase, t_progress=t_progress, probe_used=probe_used,
            output_lines=self.capture.lines, last_output=self.capture.last_output, attempt=self.attempt,
        )
        self.stall.observe(t_progress, phase, startup=startup)
        state.scratch["startup"] = startup
        state.scratch["closed_files"] = closed  # files the run wrote and closed (watchdog/ckptwatch.py)
        return state

    def _printed_a_loss(self) -> bool:
        """Whether the output so far shows a training step's loss (looked at once per new line)."""
        if not self._loss_line_seen and self.capture.lines > self._lines_scanned:
            new = min(self.capture.lines - self._lines_scanned, 200)
            recent = list(self.capture.stdout_tail)[-new:] + list(self.capture.stderr_tail)[-new:]
            self._loss_line_seen = any(_LOSS_LINE.search(line) for line in recent)
            self._lines_scanned = self.capture.lines
        return self._loss_line_seen

    def _safe_writes(self) -> float | None:
        try:
            return self.writes.poll(self.proc.pid)
        except Exception as exc:
            # Why not raise: a broken file-table read must not cost the run its watchdog; switch it off.
            self.writes._off = True
            self._guard_error(f"reading the run's file writes failed and was switched off: {exc!r}")
            return None

    def _learn_phases(self) -> None:
        """Each phase's longest completed duration, from the probe's phase events (read once each)."""
        for ev in self.reader.events("phase", since_id=self._phase_events_seen):
            self._phase_events_seen = ev["id"]
            data = ev["data"] or {}
            if ev["attempt"] == self.attempt and data.get("edge") == "end" and ev["name"]:
                try:
                    self.limits.phase_ended(str(ev["name"]), float(data.get("seconds") or 0.0))
                except (TypeError, ValueError):
                    continue

    def _poll_monitors(self, state: WatchState) -> list[Finding]:
        out = []
        for mon in list(self.monitors):
            try:
                out.extend(mon.poll(state))
            except Exception as exc:
                # Why drop it: a monitor that raises would raise again at every poll.
                self._guard_error(f"monitor {type(mon).__name__} failed and was switched off: {exc!r}")
                self.monitors.remove(mon)
        # findings the probe wrote (its online rules, when it has them)
        for f in self.reader.findings():
            out.append(f)
        return [f for f in out if self._is_new(f)]

    def _finish_monitors(self, step: int | None) -> None:
        """Monitors with a `finish(state)` get one last look after the process ended (its last rows)."""
        state = self._observe_final(step)
        for mon in list(self.monitors):
            finish = getattr(mon, "finish", None)
            if finish is None:
                continue
            try:
                for f in finish(state):
                    if self._is_new(f):
                        self._report(f)
            except Exception as exc:
                self._guard_error(f"monitor {type(mon).__name__} failed at the end: {exc!r}")

    # -- stalls: a finding at the stall timeout, a stop only on proof or past the limit -------------------

    def _watch_stall(self, state: WatchState) -> Finding | None:
        """Called at every poll; returns the run-hung finding when the run is to be stopped, else None."""
        startup = state.scratch.get("startup", False)
        mark = max(t for t in (state.t_progress, self._liveness, self.attempt_started) if t is not None)
        if self._open is not None:
            return self._follow_stall(state, mark)
        idle = self.stall.stalled(state.now, mark, self.attempt_started, state.phase, startup=startup)
        if idle is None:
            return None
        return self._on_stall(state, idle, mark)

    def _on_stall(self, state: WatchState, idle: float, mark: float) -> Finding | None:
        """A stall: take the stacks of every process of the run, name the cause, and report it.

        With proof that it cannot recover, the finding is run-hung and the run is to be stopped (returned);
        without, it is run-stalled and trainguard keeps looking (None). None also when the run turned out
        to be moving (a slow checkpoint still writing): then the time of this look counts as progress, at
        most MAX_IO_GRACE times in a row.
        """
        timeout = self.stall.timeout(state.phase, startup=state.scratch.get("startup", False))
        result, stall = self._look(state, idle, timeout)
        if stall is None:
            return None
        why = stop.proof(result.diagnosis) if result is not None else None
        if why:
            return self._stop_for(hang_finding(stall, result, stopped_because=why))
        limit, basis = self._limit(state)
        stalled = stalled_finding(hang_finding(stall, result), limit=limit, basis=basis)
        self._report(stalled)
        self._open = OpenStall(finding=stalled, since=state.t_progress or self.attempt_started, mark=mark,
                               looks=[result] if result is not None else [],
                               next_look=time.time() + self._relook(timeout))
        return None

    def _follow_stall(self, state: WatchState, mark: float) -> Finding | None:
        """An open stall: ended by progress, stopped on proof found by a later look, or past its limit."""
        st = self._open
        assert st is not None
        if mark > st.mark:
            self._end_stall(state.now - st.since, "progress resumed")
            return None
        idle = state.now - st.since
        timeout = self.stall.timeout(state.phase, startup=state.scratch.get("startup", False))
        limit, basis = self._limit(state)
        past = idle >= limit
        if not past and time.time() < st.next_look:
            return None
        result, stall = self._look(state, idle, timeout)
        if stall is None or self._open is None:
            return None  # it ended while we looked, or moved
        st.next_look = time.time() + self._relook(timeout)
        if result is not None:
            st.looks.append(result)
        why: str | None
        if past:
            why = f"the stall lasted {idle:.0f} s, past its limit of {limit:.0f} s ({basis})"
        else:
            why = stop.proof(result.diagnosis) if result is not None else None
            why = why or stop.stuck(st.looks, idle=idle, longest_done=self._longest_done(),
                                    phase_seen=self._phase_seen(state))
        return self._stop_for(hang_finding(stall, result, stopped_because=why)) if why else None

    def _look(self, state: WatchState, idle: float, timeout: float) -> tuple[Any, Stall | None]:
        """Stacks of every process, diagnosed: (the diagnosis or None, the stall it looked at), or
        (None, None) when the run ended or moved while we looked."""
        from trainguard.watchdog.hang import diagnose_stall

        stall = Stall(idle=idle, timeout=timeout, step=state.step, phase=state.phase,
                      last_progress=state.t_progress or self.attempt_started, pid=state.pid, attempt=self.attempt)
        label: int | str = self.attempt if self._looks == 0 else f"{self.attempt}-{self._looks}"
        self._looks += 1
        try:
            result = diagnose_stall(self.run_dir, state.pid, attempt=label)
        except Exception as exc:
            # Why not raise: a broken diagnosis must not cost the user the stall finding itself.
            self._guard_error(f"hang diagnosis failed: {exc!r}")
            return None, stall
        if self.proc.poll() is not None:
            return None, None  # it ended while we looked (a slow exit): the exit decides the state, not a stall
        after = self._observe()
        if after.t_progress is not None and after.t_progress > (state.t_progress or self.attempt_started):
            # Progress came while we looked (a slow start of spawned workers, say): slow, not stuck.
            self._guard_error(f"stall of {idle:.0f} s looked at, but progress resumed while sampling")
            if self._open is not None:
                self._end_stall(time.time() - self._open.since, "progress resumed")
            return None, None
        if (result.moving or result.starting) and self._io_graces < MAX_IO_GRACE:
            self._io_graces += 1
            self._liveness = time.time()
            why = (f"{result.io_bytes_moved} bytes written" if result.moving
                   else f"pid(s) {result.starting} still importing")
            self._guard_error(f"stall of {idle:.0f} s looked at: {why} while sampling, so it is slow, not a hang")
            if self._open is not None:
                self._end_stall(time.time() - self._open.since, why)
            return None, None
        return result, stall

    def _stop_for(self, hang: Finding) -> Finding:
        self._open = None
        self._report(hang)
        return hang

    def _end_stall(self, seconds: float, how: str, *, ended: bool = False) -> None:
        """Progress came back: the stall was slow work, not a hang. Its finding stays, as info."""
        st, self._open = self._open, None
        if st is None:
            return
        stall_ended(st.finding, seconds=seconds, how=how)
        self.writer.add_event("finding", st.finding.name, st.finding.to_dict(), step=st.finding.step)
        self.writer.flush()
        after = "the run went on to its end" if ended else "the run goes on"
        self._note(f"trainguard: the stall ended after {seconds:.0f} s ({how}); {after}")

    def _close_stall_at_end(self, returncode: int) -> None:
        """The run ended with a stall still open. Progress after it (a later mark, steps past the stall's) or
        a run that completed closes it as the next look would have: the run may end between two looks (a
        slow rank's last quick steps, an eval and a save, then exit) and must not leave a stale warning.
        After a signal (the user's, or our stop) nothing it did counts: the stall stays open."""
        st = self._open
        if st is None or self._signalled is not None:
            return
        state = self._observe()
        mark = max(t for t in (state.t_progress, self._liveness, self.attempt_started) if t is not None)
        stepped = state.step is not None and st.finding.step is not None and state.step > st.finding.step
        if mark > st.mark or stepped:
            self._end_stall((mark if mark > st.mark else time.time()) - st.since, "progress resumed", ended=True)
        elif returncode == 0:
            self._end_stall(time.time() - st.since, "the run completed", ended=True)

    def _limit(self, state: WatchState) -> tuple[float, str]:
        phase = state.phase
        gap = self.stall.phase_longest.get(phase, 0.0) if phase else self.stall.longest_gap
        return self.limits.limit(phase, startup=state.scratch.get("startup", False), phase_gap=gap,
                                 gaps_seen=self.stall.has_pace(phase))

    def _phase_seen(self, state: WatchState) -> bool:
        """The run has been through this phase before (its pace is known): never the start-up."""
        if state.scratch.get("startup", False):
            return False
        return state.phase is None or state.phase in self.limits.longest or self.stall.has_pace(state.phase)

    def _longest_done(self) -> float:
        """The longest quiet stretch the run came through: any gap between marks (the first step's, from the
        last mark of start-up, included) and any completed phase."""
        return max([self.stall.longest_gap, self.stall.first_gap, *self.limits.longest.values()])

    @staticmethod
    def _relook(timeout: float) -> float:
        return min(RELOOK_MAX, max(RELOOK_MIN, timeout))


    def _wait_forever_on_hang(self, state: WatchState) -> None:
        self._note("--on-hang wait: leaving the hung process alive for inspection (Ctrl-C to stop)")
        while self.proc.poll() is None:
            time.sleep(POLL_INTERVAL)

    def _conclude(self, returncode: int, hang: Finding | None, stopped: Finding | None) -> int:
        beats = [b for b in self.reader.heartbeats() if b["attempt"] == self.attempt]
        probe_events = [e for e in self.reader.events("probe") if e["attempt"] == self.attempt]
        probe_used = bool(beats) or bool(probe_events)
        finished = any(e["name"] == "finish" for e in probe_events)
        last = self.reader.last_step()
        step = max([b["step"] for b in beats if b["step"] is not None] + ([last["step"]] if last else []),
                   default=None)
        # the first process to fail is the cause; later crashes (other ranks) are its consequences
        crashes = [c for c in self.reader.events("crash") if c["attempt"] == self.attempt]
        probe_crash = crash.first_crash(crashes, silent_ranks=_silent_ranks(probe_events, crashes),
                                        abort=crash.native_abort(list(self.capture.stderr_tail)))
        stderr_crash = None
        if probe_crash is None and returncode > 0:
            # no probe: the output says which process failed first (torchrun's summary, rank prefixes, order)
            stderr_crash = first_failure_finding(
                list(self.capture.stderr_tail),
                step=step if step is not None else crash.last_printed_step(self.capture.stdout_tail),
                elapsed=self._elapsed(),
            )
        if returncode > 0:
            # a rank torchrun reports killed by a SIGKILL it did not send is the cause: the probe saw only its
            # peers' lost connections (or a rank gone silent), the output's table names the rank and the kill
            killed_rank = killed_rank_finding(
                list(self.capture.stderr_tail),
                step=step if step is not None else crash.last_printed_step(self.capture.stdout_tail),
                elapsed=self._elapsed())
            if killed_rank is not None:
                probe_crash, stderr_crash = None, killed_rank
        oom = {}
        if returncode == -signal.SIGKILL and hang is None and stopped is None:
            oom = _oom_evidence(self.proc.pid, self.oom_before)
        cut = None
        if self.scheduler is not None and hang is None and stopped is None:
            cut = self.scheduler.ending(
                returncode, step=step, total=(self.reader.meta().get("plan") or {}).get("total_steps"),
                checkpoints=[e for e in self.reader.events("checkpoint") if e["attempt"] == self.attempt])
            if cut is not None:
                probe_crash = stderr_crash = None  # the tracebacks a cut leaves are its consequence
                if cut.cause == "cancelled" and returncode >= 0:
                    returncode = -cut.signum  # a cancel is a kill, by whoever ran scancel
        unwritable = self._store_unwritable()
        if unwritable and probe_used and not finished:
            self._note(f"trainguard: the run folder stopped taking writes ({unwritable}): what the script did "
                       f"after step {step} is not in it, so whether it reached guard.finish() is not known")
        v = verdict.decide(
            returncode=returncode, hang=hang, stopped_on=stopped, probe_used=probe_used, probe_finished=finished,
            probe_crash=probe_crash, stderr_crash=stderr_crash, expects=self.options.expects,
            started=self.started, cwd=self.options.cwd or os.getcwd(), step=step, oom=oom,
            store_unwritable=unwritable, forwarded=self.forwarded,
            probe_exited=_all_exited(probe_events), total_steps=(self.reader.meta().get("plan") or {}).get("total_steps"),
            printed=self._printed_failures() if returncode != 0 and hang is None and stopped is None else None,
        )
        if cut is not None and cut.cause == "cancelled":
            v.findings = [cut.finding] + [f for f in v.findings if f.code != RUN_KILLED.code]
        elif cut is not None:
            v = verdict.cut_off(cut.cause, returncode, cut.finding, trainguard_exit=cut.exit_code)
        earlier = list(self.findings) + self.reader.findings()
        for f in v.findings:
            if f.code == crash.RUN_CRASHED.code:  # after the loss diverged: the crash says so and names the LR
                crash.after_divergence(f, earlier, lr=(last or {}).get("lr"))
                rendezvous.crash_after_rendezvous(f, earlier)  # ... or ended a start-up waiting for its peers
            self._report(f)
        for f in self.reader.findings():
            if self._is_new(f):
                self.findings.append(f)
        self._finish_monitors(step)
        self.writer.add_event("run", "end", {"state": v.state, "exit_code": v.exit_code, "signal": v.signal,
                                             "duration": self._elapsed()})
        self.writer.flush()
        final = self._observe_final(step)
        self._write_status(v.state, final, ending=v.ending, ended=time.time())
        self._summary(v, step)
        self.reader.close()
        self.writer.close()
        if self.writer.unstored:
            self._note(f"trainguard: {self.writer.unstored}")
        self._write_report()
        return self._fail_on(v.trainguard_exit)

    def _printed_failures(self) -> list[Any]:
        """The failures the command printed without a traceback (a CUDA error, `Killed`, a segfault), the
        cause first: the same catalogue `trainguard diagnose` reads a log with (rules/signatures.py)."""
        from trainguard.watchdog.liveoutput import printed_failures

        try:
            return printed_failures(self.run_dir / "output.log")
        except Exception as exc:  # the guard never becomes the failure: the verdict stands without it
            self._guard_error(f"could not read the output for its failure: {exc!r}")
            return []

    def _store_unwritable(self) -> str | None:
        """Why the run folder takes no writes (a file system gone read-only, permission taken away), or None.
        A full disk is not this: the reserve beside status.json gives the last rows their room."""
        if self.writer.last_error and not self.writer.disk_full:
            return self.writer.last_error
        try:
            fd, name = tempfile.mkstemp(dir=self.run_dir, prefix=".write-check-")
            os.close(fd)
            os.unlink(name)
        except OSError as exc:
            return exc.strerror or str(exc)
        return None

    def _fail_on(self, code: int) -> int:
        """--fail-on: a run that ended well (exit 0) but whose findings reach the given severity fails."""
        if code != 0 or self.options.fail_on not in ("error", "warning"):
            return code
        worst = {"error"} if self.options.fail_on == "error" else {"error", "warning"}
        acks = read_acks(self.run_dir)  # `trainguard ack RUN CODE`: known and accepted, not a failure
        # the most severe first: the line quotes an error, not the stall warning that came before it
        hits = most_severe_first([f for f in self.findings if f.severity in worst and f.code not in acks])
        if not hits:
            return code
        self._note(f"trainguard: exit {FAIL_ON_EXIT}: {len(hits)} finding(s) at --fail-on {self.options.fail_on}"
                   f" or worse (the first: {hits[0].code} {hits[0].name}; `trainguard ack {self.run_dir} "
                   f"{hits[0].code}` accepts it, `--fail-on never` gives the command's own code)")
        return FAIL_ON_EXIT

    def _write_report(self) -> None:
        """report.md and report.html, fail-open: a report failure never changes the verdict or exit code."""
        if self.write_report is None:
            return
        try:
            _, html_path = self.write_report(self.run_dir)
            self._note(f"trainguard: report {html_path}")
        except Exception as exc:
            self._guard_error(f"could not write the report: {exc!r}")

    def _observe_final(self, step: int | None) -> WatchState:
        # the monitors' notes of the last poll (the printed step, loss and LR) carry over to the end
        return WatchState(run_dir=self.run_dir, reader=self.reader, pid=self.proc.pid, started=self.started,
                          now=time.time(), step=step, phase=None, t_progress=None, probe_used=False,
                          output_lines=self.capture.lines, last_output=self.capture.last_output,
                          scratch={k: v for k, v in getattr(self, "_scratch", {}).items() if k == "output"})

    # -- reporting ----------------------------------------------------------------------------------

    def _is_new(self, f: Finding) -> bool:
        key = (f.code, f.name, f.cause)
        if key in self._seen:
            return False
        self._seen.add(key)
        return True

    def _report(self, f: Finding) -> None:
        self._seen.add((f.code, f.name, f.cause))
        if f.t is None:
            f.t = time.time()
        if f.source == "watchdog":
            self._with_devices(f)
        if f in self.findings:
            return  # reported already (a hang or a --stop-on finding comes back in the verdict)
        self.findings.append(f)
        if f.source != "probe":
            self.writer.add_event("finding", f.name, f.to_dict(), step=f.step)
            self.writer.flush()
        self._note(f"trainguard: {f.one_line()}")

    def _with_devices(self, f: Finding) -> None:
        """A stall or hang, told whether a device event came with it (rules/devices.py): the events are the
        probes' rows in the store; the symptom's moment is the last progress before it."""
        from trainguard.rules.devices import DeviceTimeline, annotate

        symptoms = frozenset({RUN_STALLED.name, RUN_HUNG.name})
        if f.name not in symptoms:
            return
        try:
            timeline = DeviceTimeline()
            for kind in (EVENT_DEVICE_SAMPLE, EVENT_DEVICE):
                for ev in self.reader.events(kind)[-2000:]:
                    timeline.note(ev)
            since = (f.evidence or {}).get("last_progress_at")
            if isinstance(since, (int, float)):  # the stall's whole length counts, not only what came before
                annotate(f, timeline, since, after=max(0.0, time.time() - since), symptoms=symptoms)
            else:
                annotate(f, timeline, f.t, symptoms=symptoms)
        except Exception as exc:
            self._guard_error(f"device attribution failed: {exc!r}", kind="device attribution")

    def _note(self, text: str) -> None:
        # trainguard's own lines quote exception messages and phase names: never raw control characters
        self.capture.write_note(printable(text), _buffer(sys.stderr))

    def _guard_error(self, text: str, kind: str | None = None) -> None:
        """One line in guard.log, once per `kind` (default: the text itself); repeats are only counted."""
        if not hasattr(self, "_selflog"):
            self._selflog = GuardLog(self.run_dir, WATCHDOG_RANK, who="watchdog")
        self._selflog.once(kind or text, text)

    def _write_status(self, state_name: State, state: WatchState, *, ending: Ending | None = None,
                      ended: float | None = None, findings_extra: list[Finding] | None = None) -> None:
        """status.json: live (running, hung) as the run goes, or its `ending` (store/ending.py) once over."""
        last = self.reader.last_step()
        plan = self.reader.meta().get("plan") or {}
        findings = most_severe_first(list(self.findings) + [f for f in findings_extra or [] if f not in self.findings])
        fields = {
            "step": state.step if state.step is not None else (last or {}).get("step"),
            "total_steps": plan.get("total_steps"),
            "phase": state.phase,
            "loss": _printed_or((last or {}).get("loss"), state, "loss"),
            "lr": _printed_or((last or {}).get("lr"), state, "lr"),
            "pid": self.proc.pid,
            "command": self.options.command,
            "started": self.started,
            "updated": time.time(),
            "ended": ended,
            "duration": round(self._elapsed(), 3) if ended is not None else None,  # monotonic, never negative
            "attempt": self.attempt,
            "stall_timeout": round(self.stall.timeout(state.phase), 1),
            "output_lines": state.output_lines,
            "watched_by": "watchdog",
            "owner": self._owner(),
            "command_started": self._command_started,
            "findings": [f.to_dict() for f in findings],
        }
        if self.capture.dropped_bytes:
            fields["output_dropped_bytes"] = self.capture.dropped_bytes
        if self.scheduler is not None:
            fields["scheduler"] = self.scheduler.status()
        status = ending_status(ending, **fields) if ending is not None else live_status(state_name, **fields)
        try:
            write_status(self.run_dir, status, final=ended is not None)
        except OSError as exc:
            self._guard_error(f"cannot write status.json: {exc}", kind="status.json")
            if ended is not None:
                self._note(f"trainguard: status.json could not be updated to '{state_name}' ({exc.strerror or exc}):"
                           " it keeps its last state; `trainguard status` says that its owner is gone")

    def _elapsed(self) -> float:
        """Seconds since the run started, by the monotonic clock (the wall clock may jump: NTP, a person)."""
        return time.monotonic() - getattr(self, "_t0", time.monotonic())

    def _owner(self) -> dict[str, Any]:
        if not hasattr(self, "_owner_record"):
            self._owner_record = owner_record()
        return self._owner_record

    def _summary(self, v: verdict.Verdict, step: int | None) -> None:
        dur = self._elapsed()
        acks = read_acks(self.run_dir)
        severities = {f.severity for f in self.findings if f.code not in acks}
        # as status.json's health says it (store/status.py): a bad end is an error; a cut-off is as its findings
        health = ("error" if v.state in BAD_ENDS or "error" in severities else
                  "warning" if "warning" in severities else "ok")
        head = f"trainguard: run {v.state}"
        if v.ending.hung or v.ending.stopped:
            # trainguard ended it: its own exit code, and the command's as a consequence of that stop (a
            # launcher that turns SIGTERM into an exception, torchrun's SignalException, exits 1)
            how = v.signal or (f"with code {v.exit_code}" if v.exit_code not in (None, 0) else None)
            head += (f" (stopped by trainguard, exit {v.trainguard_exit}"
                     + (f"; the command exited {how} on that stop" if how else "") + ")")
        elif v.signal:
            head += f" ({v.signal})"
        elif v.exit_code not in (None, 0):
            head += f" (exit code {v.exit_code})"
        head += f" after {dur:.1f} s"
        if step is not None:
            head += f", step {step}"
        head += f"; health {health}"
        lines = [head]
        # an acknowledged finding is listed as such, never counted as an open error beside "health ok"
        errors = [f for f in self.findings if f.severity == "error" and f.code not in acks]
        warnings = [f for f in self.findings if f.severity == "warning" and f.code not in acks]
        acked = sum(f.code in acks for f in self.findings)
        if not self.findings:
            lines.append("trainguard: no findings")
        else:
            lines.append(f"trainguard: {len(errors)} error(s), {len(warnings)} warning(s)"
                         + (f", {acked} acknowledged" if acked else ""))
            for f in sorted(most_severe_first(self.findings), key=lambda f: f.code in acks)[:8]:  # open first
                ack = acks.get(f.code)
                lines.append(f"  {f.one_line()}" + (f" (acknowledged by {ack['by']})" if ack else ""))
                if f.where:
                    lines.append(f"    where: {f.where}")
                if f.fix:
                    lines.append(f"    fix: {f.fix}")
        lines.append(f"trainguard: run folder {self.run_dir}")
        for text in lines:
            self._note(text)

    # -- process control ----------------------------------------------------------------------------

    def _signal_sent(self) -> None:
        """From now on nothing the command prints or writes counts as progress (see `_observe`)."""
        if getattr(self, "_signalled", None) is None:
            self._signalled = time.time()
            self.capture.deaf_from = self._signalled

    def _terminate(self) -> None:
        """SIGTERM the command's process group, then SIGKILL whatever is left after a grace period."""
        self._signal_sent()
        pgid = self.proc.pid
        try:
            os.killpg(pgid, signal.SIGTERM)
        except ProcessLookupError:
            return
        deadline = time.time() + KILL_GRACE
        while time.time() < deadline and self.proc.poll() is None:
            time.sleep(0.1)
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def _forward_signals(self) -> None:
        self._old_handlers = {}

        def forward(signum: int, frame: Any) -> None:
            if self.scheduler is not None:
                self.scheduler.on_signal(signum, self.run_dir)
            if signum in WARNING_SIGNALS and self.scheduler is not None:
                # a warning lets the run go on (to save): progress still counts, and only a process that
                # catches it gets it (one that does not would die of it)
                self.scheduler.pass_warning(signum, self.proc.pid)
                return
            self.forwarded = signum
            self._signal_sent()
            try:
                os.killpg(self.proc.pid, signum)
            except ProcessLookupError:
                pass

        # under Slurm also sbatch --signal's warnings (unhandled, SIGUSR1 would end the watchdog itself)
        extra = WARNING_SIGNALS if self.scheduler is not None else ()
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, *extra):
            try:
                self._old_handlers[sig] = signal.signal(sig, forward)
            except (ValueError, OSError):
                pass  # not the main thread (tests may run the supervisor in a thread)

    def _restore_signals(self) -> None:
        for sig, handler in getattr(self, "_old_handlers", {}).items():
            try:
                signal.signal(sig, handler)
            except (ValueError, OSError):
                pass

    def _write_meta(self) -> None:
        w = self.writer
        w.set_meta("command", self.options.command)
        w.set_meta("cwd", os.getcwd())
        w.set_meta("started", self.started)
        w.set_meta("host", platform.node())
        w.set_meta("user", _safe(getpass.getuser))
        w.set_meta("watchdog", {"pid": os.getpid(), "trainguard": __version__, "python": sys.version.split()[0],
                                "platform": platform.platform(), "stall_timeout": self.options.stall_timeout,
                                "hang_limits": self.options.hang_limits,
                                "expects": self.options.expects, "on_hang": self.options.on_hang,
                                "notify": self.options.notify})
        w.set_meta("env", {k: os.environ[k] for k in ("CUDA_VISIBLE_DEVICES", "WORLD_SIZE", "SLURM_JOB_ID")
                           if k in os.environ})
        if self.scheduler is not None:
            w.set_meta("scheduler", self.scheduler.status())
        w.flush()


def _label(command: list[str]) -> str:
    """A short name for the run folder: the script or module a python command runs, else the program."""
    if Path(command[0]).name.startswith("python") and len(command) > 1:
        if command[1] == "-m" and len(command) > 2:
            return command[2].rsplit(".", 1)[-1]
        return Path(command[1]).stem
    return Path(command[0]).name


def _printed_or(value: Any, state: WatchState, key: str) -> Any:
    """A value the probe did not measure, from what the command printed (watchdog/liveoutput.py)."""
    return value if value is not None else (state.scratch.get("output") or {}).get(key)


def _buffer(stream: Any) -> Any:
    return getattr(stream, "buffer", None)


def _safe(fn: Any) -> Any:
    try:
        return fn()
    except Exception:
        return None


def _safe_oom() -> int | None:
    from trainguard.watchdog.kernel import cgroup_oom_kills

    return cgroup_oom_kills()


def _all_exited(probe_events: list[dict[str, Any]]) -> bool:
    """Every process whose probe started recorded the interpreter's normal exit (none left by `os._exit`)."""
    started = {e["rank"] for e in probe_events if e["name"] == "start"}
    exited = {e["rank"] for e in probe_events if e["name"] == "exit"}
    return started <= exited


def _silent_ranks(probe_events: list[dict[str, Any]], crashes: list[dict[str, Any]]) -> list[int]:
    """Ranks whose probe started but recorded no finish, no exit and no crash: ended by a signal or a
    segfault, or `os._exit` (for the root cause when the others' errors only say they lost a peer)."""
    started = {e["rank"] for e in probe_events if e["name"] == "start"}
    ended = {e["rank"] for e in probe_events if e["name"] in ("finish", "exit")} | {c["rank"] for c in crashes}
    return sorted(r for r in started - ended if isinstance(r, int) and r >= 0)


def _oom_evidence(pid: int, before: int | None) -> dict[str, Any]:
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



def _become_subreaper() -> bool:
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


def _environ_of(pid: int) -> dict[str, str]:
    try:
        import psutil

        return dict(psutil.Process(pid).environ())
    except Exception:
        return {}


def _orphans(keep: set[int | None], since: float) -> list[dict[str, Any]]:
    """The watchdog's own live descendants made since `since` (the attempt's start), other than `keep` (its
    keeper, what it had before): after the command exited, processes of the run reparented to it (see
    `_become_subreaper`)."""
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


def _kill_all(pids: list[int]) -> None:
    """SIGTERM, a grace period, SIGKILL: for processes of the run outside its process group."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        if sig == signal.SIGTERM and pids:
            deadline = time.time() + KILL_GRACE
            while time.time() < deadline and any(_alive(p) for p in pids):
                time.sleep(0.1)
    for pid in pids:  # ours since they were reparented: reaped here, not left as zombies
        try:
            os.waitpid(pid, os.WNOHANG)
        except OSError:
            pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        return done == 0
    except ChildProcessError:
        return True


def _group_members(pgid: int) -> list[dict[str, Any]]:
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
