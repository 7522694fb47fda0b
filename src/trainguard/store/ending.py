"""A run's ending: the one place where what is known of how a run ended becomes its state and status.json.

Three writers know an ending, each from where it stands: the watchdog (`trainguard run`: the exit code or
signal, a hang it stopped, the probe's finish, the expected artifacts), a script running alone (its probe
saw `finish()`, an uncaught exception, or the interpreter leaving without either) and preflight (its
checks failed, or the script could not be checked). Each gathers its `Ending` and calls `ending_status`;
nobody else decides a final state.

    status = ending_status(Ending(exit_code=0, probe_used=True, probe_finished=True), step=1200, ...)
    write_status(run_dir, status, final=True)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trainguard.contract import checked_status

if TYPE_CHECKING:
    from trainguard.contract import PreflightOutcome, State, Status


@dataclass(frozen=True)
class Ending:
    """The facts of an ending, as far as the writer knows them (a fact it cannot know stays at its default)."""

    exit_code: int | None = None  # the command's exit code (None: unknown, e.g. a probe at interpreter exit)
    signal: str | None = None  # the signal that ended it, when trainguard did not send it for a hang
    hung: bool = False  # no progress past the stall timeout (trainguard stopped it, or it is still alive)
    stopped: bool = False  # stopped on purpose: a --stop-on finding, or the watchdog itself failed
    crashed: bool = False  # an uncaught exception (the probe saw it; the exit code may still be unknown)
    probe_used: bool = False  # the script had a probe (its own `watch()` or the automatic one)
    probe_finished: bool = False  # ...and it reached `finish()`
    finish_forgotten: bool = False  # ...or not, but it exited normally with no sign of an early end (TG506 warns)
    artifacts_missing: bool = False  # an expected artifact (--expect) is missing or stale
    cut_by: str | None = None  # its job scheduler ended it: time-limit, preempted, requeued, node-failure
    exit_unknown: bool = False  # the command ended unwatched (its watchdog was killed): how is not known
    preflight: PreflightOutcome | None = None  # preflight's verdict on the script (passed, incomplete, failed)


def state_of(e: Ending) -> State:
    """How the run ended, in one word (the table in watchdog/verdict.py's docstring). Silence is not success."""
    if e.hung:
        return "hung"
    if e.preflight is not None:
        # the script's start was stopped by preflight on purpose: the state says whether the check failed
        return "failed" if e.preflight == "failed" else "completed"
    if e.stopped or e.exit_unknown:
        return "failed"  # (an ending nobody saw is never called completed)
    if e.cut_by is not None:
        return "cut-off"
    if e.signal is not None:
        return "killed"
    if e.crashed or e.exit_code not in (None, 0):
        return "crashed"
    if e.artifacts_missing or (e.probe_used and not e.probe_finished and not e.finish_forgotten):
        return "failed"
    return "completed"


def ending_status(e: Ending, **fields: Any) -> Status:
    """status.json's content for an ending: its state, exit code and signal from `e`, then the writer's
    own fields (step, findings, who wrote it...). A field may not contradict the ending."""
    status: dict[str, Any] = {"state": state_of(e), "exit_code": e.exit_code, "signal": e.signal}
    if e.preflight is not None:
        status["preflight_outcome"] = e.preflight
    clash = [k for k in status if k in fields]
    if clash:
        raise ValueError(f"ending_status: {', '.join(clash)} come from the Ending, not from the fields")
    return checked_status({**status, **fields})


def how_it_exited(state: str | None, exit_code: Any, signal: str | None) -> str | None:
    """The words beside a final state: "SIGTERM", "exit code 1", or for a run trainguard stopped (hung) "stopped
    by trainguard; the command exited with code 1 on that stop" (what the command exited with then is the
    stop's consequence, not a crash); None when there is nothing to add."""
    if state == "hung":
        code = signal or (f"with code {exit_code}" if exit_code not in (None, 0) else None)
        return "stopped by trainguard" + (f"; the command exited {code} on that stop" if code else "")
    if signal:
        return str(signal)
    if exit_code not in (None, 0):
        return f"exit code {exit_code}"
    return None


def live_status(state: State, **fields: Any) -> Status:
    """status.json's content while the run lives (running, or hung and not stopped yet)."""
    return checked_status({"state": state, "exit_code": None, "signal": None, **fields})
