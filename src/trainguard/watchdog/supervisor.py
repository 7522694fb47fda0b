"""`trainguard run`: start the command, watch it, and tell the true final state.

    trainguard run [--run-dir DIR] [--stall-timeout S] [--hang-limit S] [--expect PATH ...] -- python train.py

The supervisor starts the command in its own process group (so the whole tree can be signalled), tees
its output into the run folder, and every half second reads the probe's heartbeat and steps from the
store, updates status.json and the live status line, and asks its monitors (stall detection; the rules
add theirs) for findings. When the process ends, `verdict.decide` names the state.

A stall (no progress for the stall timeout) is a finding at once; the run is stopped only on proof that it
cannot recover or past the stall's limit (watchdog/stop.py). Until then trainguard keeps looking.

Its parts: each start of the command is an `Attempt` (watchdog/attempt.py: its state, made anew at each
start, its environment, and the following of its stalls); the verdict at the end is assembled in
watchdog/conclusion.py; the run's processes, their signals and OOM kills in watchdog/processes.py; what a
monitor sees in watchdog/watchstate.py; the run's meta in watchdog/runmeta.py.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainguard import exitcodes
from trainguard.contract import ENV_ATTEMPT, ENV_RUN_DIR
from trainguard.errors import UserError
from trainguard.findings import Finding, most_severe_first
from trainguard.rules import crash
from trainguard.store import lock as run_lock
from trainguard.store.acks import read_acks
from trainguard.store.ending import Ending, ending_status, live_status
from trainguard.store.nodes import node_dir
from trainguard.store.owner import owner_record
from trainguard.store.paths import new_run_dir, prepare_run_dir, runs_root
from trainguard.store.reader import RunReader
from trainguard.store.selflog import GuardLog
from trainguard.store.status import reserve_space, write_status
from trainguard.store.writer import StoreWriter
from trainguard.untrusted import printable
from trainguard.watchdog import conclusion, keeper, nodes, rendezvous, restart, statusline, verdict
from trainguard.watchdog.attempt import Attempt, child_env, start_command
from trainguard.watchdog.processes import (
    become_subreaper,
    environ_of,
    forward_signals,
    group_members,
    kill_all,
    oom_kills,
    orphans,
    restore_signals,
    terminate_group,
)
from trainguard.watchdog.runmeta import write_meta
from trainguard.watchdog.scheduler import SlurmRun
from trainguard.watchdog.stall import with_devices
from trainguard.watchdog.tee import OutputCapture
from trainguard.watchdog.watchstate import Monitor, WatchState

if TYPE_CHECKING:
    from trainguard.contract import State

POLL_INTERVAL = 0.5
WATCHDOG_RANK = -1  # rows the watchdog writes carry rank -1
FAIL_ON_EXIT = exitcodes.HEALTH  # a completed run whose unacknowledged findings reach --fail-on's severity
# A line that shows a training step's loss: for a script without the probe, the end of its start-up.
_LOSS_LINE = re.compile(r"(?i)\bloss\b['\"]?\s*[:=]?\s*[-+]?(\d|nan|inf)")


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
    current: Attempt  # the command's start under way (or the last one): made anew at each start

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
        self._scratch: dict[str, Any] = {}  # the monitors' notes of the last poll (carried over to the end)

    # -- the run ----------------------------------------------------------------------------------

    def run(self) -> int:
        become_subreaper()  # orphans of the command (a daemon that called setsid()) come to us, not to init
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
            resume_from, why = restart.resume_choice(self.monitors, self.reader, self._guard_error)
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

    def _attempt(self, resume: str | None) -> tuple[int, Finding | None, Finding | None]:
        """One run of the command, to its end or to a hang; returns (exit code, hang, stopped-on)."""
        cur = self.current = Attempt(
            self.attempt, self.run_dir, stall_timeout=self.options.stall_timeout, hang_limits=self.options.hang_limits,
            writer=self.writer, report=self._report, note=self._note, guard_error=self._guard_error,
            observe=self._observe, exited=self._exited)
        self.capture.deaf_from = None
        if self.scheduler is not None:
            self.scheduler.clear_stop_request(self.run_dir)
        env = child_env(self.run_dir, self.attempt, resume, self.options.env)
        cur.children_before = {m["pid"] for m in orphans(keep=set(), since=0.0)}  # not the run's (in-process callers)
        self.proc = start_command(self.options.command, env, self.options.cwd)
        cur.command_started = owner_record(self.proc.pid)["started"]
        self.writer.add_event("run", "start", {"pid": self.proc.pid, "command": self.options.command,
                                               "attempt": self.attempt, "resume_from": resume})
        self.writer.flush()
        stdout, stderr = self.proc.stdout, self.proc.stderr
        assert stdout is not None and stderr is not None  # both are pipes (Popen above)
        self.capture.start(stdout, "stdout", _buffer(sys.stdout))
        self.capture.start(stderr, "stderr", _buffer(sys.stderr))
        # if this process is killed, the keeper passes the output on: the command never dies of a broken pipe
        cur.keeper = keeper.start(self.run_dir, stdout.fileno(), stderr.fileno(),
                                  self.options.echo, lock_fd=self.lock.fd)
        self._old_handlers = forward_signals(self.proc.pid, self.scheduler, self.run_dir, self._forwarded)
        cur.oom_before = oom_kills()
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
                if state.t_progress and cur.liveness and state.t_progress > cur.liveness:
                    cur.io_graces = 0  # real progress again: the slow save finished
                if hang is None and stopped is None and self.proc.poll() is None:
                    hang = cur.watch_stall(state)
                    if hang is not None:
                        if self.options.on_hang == "wait":
                            self._write_status("hung", state, findings_extra=[hang])
                            self._wait_forever_on_hang(state)
                        self._terminate()
                self._write_status("running" if hang is None else "hung", state)
                self.line.show(state, self.options, cur.stall.timeout(state.phase), self.findings, self.run_dir)
        finally:
            self.line.clear()
            restore_signals(self._old_handlers)
        returncode = self.proc.wait()
        members = group_members(self.proc.pid)
        # a descendant that left the group with setsid() was reparented to us (a child subreaper, see
        # `run`) when its parent exited: still the run's, found among our own children
        escaped = [m for m in orphans(keep={getattr(cur.keeper, "pid", None)} | cur.children_before,
                                      since=cur.started)
                   if m["pid"] not in {x["pid"] for x in members} and self._of_this_run(m["pid"])]
        if members or escaped:
            step = max((b["step"] for b in self.reader.heartbeats() if b["step"] is not None), default=None)
            self._report(verdict.leftover_finding(members + escaped, step))
            self._terminate()
            kill_all([m["pid"] for m in escaped])
        self.capture.drain()
        cur.close_stall_at_end(returncode)
        keeper.stop(cur.keeper)
        return returncode, hang, stopped

    def _of_this_run(self, pid: int) -> bool:
        """A process the command started (its environment names this run and attempt, as the command's own),
        not one the watchdog started for itself (a sink's service such as wandb-core, a checkpoint verifier,
        a notifier's command), which are its children too."""
        env = environ_of(pid)
        return (env.get(ENV_RUN_DIR) == str(self.run_dir.resolve())
                and env.get(ENV_ATTEMPT) == str(self.attempt))

    def _exited(self) -> bool:
        """The command's process ended (the attempt's stall looks ask, so as not to judge an exit)."""
        return self.proc.poll() is not None

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
        cur = self.current
        if cur.signalled is None:
            cur.progress_before_signal = t_progress
        else:
            # Once a signal was sent, whatever the processes print or write is their dying (a traceback,
            # torchrun's "Sending process N closing signal", a save on SIGTERM), never "progress resumed".
            t_progress = cur.progress_before_signal
        self._learn_phases()
        closed = cur.writes.take_closed()
        state = WatchState(
            run_dir=self.run_dir, reader=self.reader, pid=self.proc.pid, started=self.started, now=time.time(),
            step=step, phase=phase, t_progress=t_progress, probe_used=probe_used,
            output_lines=self.capture.lines, last_output=self.capture.last_output, attempt=self.attempt,
        )
        cur.stall.observe(t_progress, phase, startup=startup)
        state.scratch["startup"] = startup
        state.scratch["closed_files"] = closed  # files the run wrote and closed (watchdog/ckptwatch.py)
        return state

    def _printed_a_loss(self) -> bool:
        """Whether the output so far shows a training step's loss (looked at once per new line)."""
        cur = self.current
        if not cur.loss_line_seen and self.capture.lines > cur.lines_scanned:
            new = min(self.capture.lines - cur.lines_scanned, 200)
            recent = list(self.capture.stdout_tail)[-new:] + list(self.capture.stderr_tail)[-new:]
            cur.loss_line_seen = any(_LOSS_LINE.search(line) for line in recent)
            cur.lines_scanned = self.capture.lines
        return cur.loss_line_seen

    def _safe_writes(self) -> float | None:
        try:
            return self.current.writes.poll(self.proc.pid)
        except Exception as exc:
            # Why not raise: a broken file-table read must not cost the run its watchdog; switch it off.
            self.current.writes._off = True
            self._guard_error(f"reading the run's file writes failed and was switched off: {exc!r}")
            return None

    def _learn_phases(self) -> None:
        """Each phase's longest completed duration, from the probe's phase events (read once each)."""
        cur = self.current
        for ev in self.reader.events("phase", since_id=cur.phase_events_seen):
            cur.phase_events_seen = ev["id"]
            data = ev["data"] or {}
            if ev["attempt"] == self.attempt and data.get("edge") == "end" and ev["name"]:
                try:
                    cur.limits.phase_ended(str(ev["name"]), float(data.get("seconds") or 0.0))
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

    def _wait_forever_on_hang(self, state: WatchState) -> None:
        self._note("--on-hang wait: leaving the hung process alive for inspection (Ctrl-C to stop)")
        while self.proc.poll() is None:
            time.sleep(POLL_INTERVAL)

    def _conclude(self, returncode: int, hang: Finding | None, stopped: Finding | None) -> int:
        v, step, last = conclusion.assemble(
            returncode, hang, stopped, reader=self.reader, attempt=self.attempt, capture=self.capture,
            pid=self.proc.pid, oom_before=self.current.oom_before, scheduler=self.scheduler,
            expects=self.options.expects, cwd=self.options.cwd, started=self.started, forwarded=self.forwarded,
            elapsed=self._elapsed, writer=self.writer, run_dir=self.run_dir, note=self._note,
            guard_error=self._guard_error)
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
                          scratch={k: v for k, v in self._scratch.items() if k == "output"})

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
            with_devices(f, self.reader, self._guard_error)
        if f in self.findings:
            return  # reported already (a hang or a --stop-on finding comes back in the verdict)
        self.findings.append(f)
        if f.source != "probe":
            self.writer.add_event("finding", f.name, f.to_dict(), step=f.step)
            self.writer.flush()
        self._note(f"trainguard: {f.one_line()}")

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
            "stall_timeout": round(self.current.stall.timeout(state.phase), 1),
            "output_lines": state.output_lines,
            "watched_by": "watchdog",
            "owner": self._owner(),
            "command_started": self.current.command_started,
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
        for text in conclusion.summary_lines(v, step, self.findings, run_dir=self.run_dir, duration=self._elapsed()):
            self._note(text)

    # -- process control ----------------------------------------------------------------------------

    def _signal_sent(self) -> None:
        """From now on nothing the command prints or writes counts as progress (see `_observe`)."""
        cur = self.current
        if cur.signalled is None:
            cur.signalled = time.time()
            self.capture.deaf_from = cur.signalled

    def _terminate(self) -> None:
        """SIGTERM the command's process group, then SIGKILL whatever is left after a grace period."""
        self._signal_sent()
        terminate_group(self.proc)

    def _forwarded(self, signum: int) -> None:
        """An ending signal the watchdog got was passed on to the command (processes.forward_signals)."""
        self.forwarded = signum
        self._signal_sent()

    def _write_meta(self) -> None:
        write_meta(self.writer, self.options, self.started, self.scheduler)


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
