"""One start of the command: what is made anew at each start, its environment, and its stalls.

`trainguard run --on-hang restart` starts the command again after a hang: each start is an `Attempt`,
made by the supervisor (watchdog/supervisor.py) just before the command starts, and holding everything
that must not carry over from the attempt before (the stall policy and stop limits learned, the open
stall and the looks at it, when a signal went to the command, the writes watched). The supervisor hands
it the few things it uses of the supervisor: the store writer, and its report, note, guard-error,
observe and exited calls.

A stall (no progress for the stall timeout) is a finding at once; the run is stopped only on proof that
it cannot recover or past the stall's limit (watchdog/stop.py). Until then trainguard keeps looking.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainguard.contract import ENV_ATTEMPT, ENV_RESUME_FROM, ENV_RUN_DIR, ENV_STACKS, ENV_WATCHDOG
from trainguard.errors import UserError
from trainguard.findings import Finding
from trainguard.store.writer import StoreWriter
from trainguard.watchdog import stop
from trainguard.watchdog.stall import Stall, StallPolicy, hang_finding, stall_ended, stalled_finding
from trainguard.watchdog.watchstate import WatchState
from trainguard.watchdog.writes import WriteWatch

MAX_IO_GRACE = 5  # stalls forgiven in a row because the run was still writing or importing
RELOOK_MIN, RELOOK_MAX = 5.0, 300.0  # seconds between looks at an open stall (the stall timeout, within these)


@dataclass
class OpenStall:
    """A stall reported as run-stalled and still going on: what the looks at it saw so far."""

    finding: Finding
    since: float  # the last progress before it
    mark: float  # the progress mark it is measured against (progress past it ends the stall)
    looks: list[Any]
    next_look: float


def child_env(run_dir: Path, attempt: int, resume: str | None, extra: dict[str, str]) -> dict[str, str]:
    """The command's environment: the watchdog's, with the run folder, the attempt and the resume path."""
    env = dict(os.environ)
    env.update({ENV_RUN_DIR: str(run_dir.resolve()), ENV_WATCHDOG: "1", ENV_ATTEMPT: str(attempt),
                "PYTHONUNBUFFERED": "1"})
    env.pop(ENV_RESUME_FROM, None)
    # a stacks folder inherited from a watched caller (a notebook, a test runner, an outer run) is that
    # run's: this run's processes dump into its own, which the bootstrap makes from ENV_RUN_DIR
    env.pop(ENV_STACKS, None)
    env.update(extra)
    if resume:
        env[ENV_RESUME_FROM] = resume
    return env


def start_command(command: list[str], env: dict[str, str], cwd: str | None) -> subprocess.Popen[bytes]:
    """The command in its own session and process group (so the whole tree can be signalled), its output
    piped to the watchdog."""
    try:
        return subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, start_new_session=True, cwd=cwd,
        )
    except OSError as exc:
        raise UserError(f"cannot start {command[0]}: {exc.strerror or exc}") from None


class Attempt:
    """One start of the command: its state, made anew at each start, and the following of its stalls."""

    def __init__(self, number: int, run_dir: Path, *, stall_timeout: float | None, hang_limits: dict[str, float],
                 writer: StoreWriter, report: Callable[[Finding], None], note: Callable[[str], None],
                 guard_error: Callable[[str], None], observe: Callable[[], WatchState],
                 exited: Callable[[], bool]) -> None:
        self.number = number
        self.run_dir = run_dir
        self.writer = writer
        self.report, self.note, self.guard_error = report, note, guard_error
        self.observe = observe  # the supervisor's look at the run now
        self.exited = exited  # whether the command's process ended
        self.started = time.time()
        self.stall = StallPolicy(fixed=stall_timeout)
        self.limits = stop.StopLimits(user=dict(hang_limits))
        self.liveness: float | None = None  # a slow save that keeps moving counts as progress
        self.io_graces = 0
        self.open: OpenStall | None = None
        self.looks = 0
        self.phase_events_seen = 0
        self.loss_line_seen = False
        self.lines_scanned = 0
        self.signalled: float | None = None  # when a signal went to the command (the user's, or our stop)
        self.progress_before_signal: float | None = None
        self.writes = WriteWatch(run_dir)
        # set as the command starts (supervisor)
        self.children_before: set[int] = set()  # the watchdog's own children before it (not the run's)
        self.command_started: Any = None  # the command's start time, as its process record says
        self.keeper: Any = None  # the process that passes the output on if the watchdog is killed
        self.oom_before: int | None = None  # the cgroup's OOM kills before the command started

    # -- stalls: a finding at the stall timeout, a stop only on proof or past the limit -------------------

    def watch_stall(self, state: WatchState) -> Finding | None:
        """Called at every poll; returns the run-hung finding when the run is to be stopped, else None."""
        startup = state.scratch.get("startup", False)
        mark = max(t for t in (state.t_progress, self.liveness, self.started) if t is not None)
        if self.open is not None:
            return self._follow_stall(state, mark)
        idle = self.stall.stalled(state.now, mark, self.started, state.phase, startup=startup)
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
        self.report(stalled)
        self.open = OpenStall(finding=stalled, since=state.t_progress or self.started, mark=mark,
                              looks=[result] if result is not None else [],
                              next_look=time.time() + self._relook(timeout))
        return None

    def _follow_stall(self, state: WatchState, mark: float) -> Finding | None:
        """An open stall: ended by progress, stopped on proof found by a later look, or past its limit."""
        st = self.open
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
        if stall is None or self.open is None:
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
                      last_progress=state.t_progress or self.started, pid=state.pid, attempt=self.number)
        label: int | str = self.number if self.looks == 0 else f"{self.number}-{self.looks}"
        self.looks += 1
        try:
            result = diagnose_stall(self.run_dir, state.pid, attempt=label)
        except Exception as exc:
            # Why not raise: a broken diagnosis must not cost the user the stall finding itself.
            self.guard_error(f"hang diagnosis failed: {exc!r}")
            return None, stall
        if self.exited():
            return None, None  # it ended while we looked (a slow exit): the exit decides the state, not a stall
        after = self.observe()
        if after.t_progress is not None and after.t_progress > (state.t_progress or self.started):
            # Progress came while we looked (a slow start of spawned workers, say): slow, not stuck.
            self.guard_error(f"stall of {idle:.0f} s looked at, but progress resumed while sampling")
            if self.open is not None:
                self._end_stall(time.time() - self.open.since, "progress resumed")
            return None, None
        if (result.moving or result.starting) and self.io_graces < MAX_IO_GRACE:
            self.io_graces += 1
            self.liveness = time.time()
            why = (f"{result.io_bytes_moved} bytes written" if result.moving
                   else f"pid(s) {result.starting} still importing")
            self.guard_error(f"stall of {idle:.0f} s looked at: {why} while sampling, so it is slow, not a hang")
            if self.open is not None:
                self._end_stall(time.time() - self.open.since, why)
            return None, None
        return result, stall

    def _stop_for(self, hang: Finding) -> Finding:
        self.open = None
        self.report(hang)
        return hang

    def _end_stall(self, seconds: float, how: str, *, ended: bool = False) -> None:
        """Progress came back: the stall was slow work, not a hang. Its finding stays, as info."""
        st, self.open = self.open, None
        if st is None:
            return
        stall_ended(st.finding, seconds=seconds, how=how)
        self.writer.add_event("finding", st.finding.name, st.finding.to_dict(), step=st.finding.step)
        self.writer.flush()
        after = "the run went on to its end" if ended else "the run goes on"
        self.note(f"trainguard: the stall ended after {seconds:.0f} s ({how}); {after}")

    def close_stall_at_end(self, returncode: int) -> None:
        """The run ended with a stall still open. Progress after it (a later mark, steps past the stall's) or
        a run that completed closes it as the next look would have: the run may end between two looks (a
        slow rank's last quick steps, an eval and a save, then exit) and must not leave a stale warning.
        After a signal (the user's, or our stop) nothing it did counts: the stall stays open."""
        st = self.open
        if st is None or self.signalled is not None:
            return
        state = self.observe()
        mark = max(t for t in (state.t_progress, self.liveness, self.started) if t is not None)
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
