"""The end of a run under the watchdog: the verdict assembled from what the store, the output and the
scheduler say about the last attempt (watchdog/verdict.py decides the state), and the lines said at the end.

The supervisor (watchdog/supervisor.py) calls `assemble` once the command's process ended, then reports
the verdict's findings, writes the final status.json and says `summary_lines`.
"""

from __future__ import annotations

import os
import signal
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainguard.findings import Finding, most_severe_first
from trainguard.rules import crash
from trainguard.rules.ending import RUN_KILLED
from trainguard.rules.firstfailure import first_failure_finding
from trainguard.rules.killedrank import killed_rank_finding
from trainguard.store.acks import read_acks
from trainguard.store.reader import RunReader
from trainguard.store.status import BAD_ENDS
from trainguard.store.writer import StoreWriter
from trainguard.watchdog import verdict
from trainguard.watchdog.processes import oom_evidence
from trainguard.watchdog.scheduler import SlurmRun
from trainguard.watchdog.tee import OutputCapture


def assemble(returncode: int, hang: Finding | None, stopped: Finding | None, *, reader: RunReader, attempt: int,
             capture: OutputCapture, pid: int, oom_before: int | None, scheduler: SlurmRun | None,
             expects: list[str], cwd: str | None, started: float, forwarded: int | None,
             elapsed: Callable[[], float], writer: StoreWriter, run_dir: Path, note: Callable[[str], None],
             guard_error: Callable[[str], None]) -> tuple[verdict.Verdict, int | None, dict[str, Any] | None]:
    """The last attempt's verdict, with the step it reached and the store's last step row."""
    beats = [b for b in reader.heartbeats() if b["attempt"] == attempt]
    probe_events = [e for e in reader.events("probe") if e["attempt"] == attempt]
    probe_used = bool(beats) or bool(probe_events)
    finished = any(e["name"] == "finish" for e in probe_events)
    last = reader.last_step()
    step = max([b["step"] for b in beats if b["step"] is not None] + ([last["step"]] if last else []),
               default=None)
    # the first process to fail is the cause; later crashes (other ranks) are its consequences
    crashes = [c for c in reader.events("crash") if c["attempt"] == attempt]
    probe_crash = crash.first_crash(crashes, silent_ranks=silent_ranks(probe_events, crashes),
                                    abort=crash.native_abort(list(capture.stderr_tail)))
    stderr_crash = None
    if probe_crash is None and returncode > 0:
        # no probe: the output says which process failed first (torchrun's summary, rank prefixes, order)
        stderr_crash = first_failure_finding(
            list(capture.stderr_tail),
            step=step if step is not None else crash.last_printed_step(capture.stdout_tail),
            elapsed=elapsed(),
        )
    if returncode > 0:
        # a rank torchrun reports killed by a SIGKILL it did not send is the cause: the probe saw only its
        # peers' lost connections (or a rank gone silent), the output's table names the rank and the kill
        killed_rank = killed_rank_finding(
            list(capture.stderr_tail),
            step=step if step is not None else crash.last_printed_step(capture.stdout_tail),
            elapsed=elapsed())
        if killed_rank is not None:
            probe_crash, stderr_crash = None, killed_rank
    oom = {}
    if returncode == -signal.SIGKILL and hang is None and stopped is None:
        oom = oom_evidence(pid, oom_before)
    cut = None
    if scheduler is not None and hang is None and stopped is None:
        cut = scheduler.ending(
            returncode, step=step, total=(reader.meta().get("plan") or {}).get("total_steps"),
            checkpoints=[e for e in reader.events("checkpoint") if e["attempt"] == attempt])
        if cut is not None:
            probe_crash = stderr_crash = None  # the tracebacks a cut leaves are its consequence
            if cut.cause == "cancelled" and returncode >= 0:
                returncode = -cut.signum  # a cancel is a kill, by whoever ran scancel
    unwritable = store_unwritable(writer, run_dir)
    if unwritable and probe_used and not finished:
        note(f"trainguard: the run folder stopped taking writes ({unwritable}): what the script did "
             f"after step {step} is not in it, so whether it reached guard.finish() is not known")
    v = verdict.decide(
        returncode=returncode, hang=hang, stopped_on=stopped, probe_used=probe_used, probe_finished=finished,
        probe_crash=probe_crash, stderr_crash=stderr_crash, expects=expects,
        started=started, cwd=cwd or os.getcwd(), step=step, oom=oom,
        store_unwritable=unwritable, forwarded=forwarded,
        probe_exited=all_exited(probe_events), total_steps=(reader.meta().get("plan") or {}).get("total_steps"),
        printed=output_failures(run_dir, guard_error) if returncode != 0 and hang is None and stopped is None else None,
    )
    if cut is not None and cut.cause == "cancelled":
        v.findings = [cut.finding] + [f for f in v.findings if f.code != RUN_KILLED.code]
    elif cut is not None:
        v = verdict.cut_off(cut.cause, returncode, cut.finding, trainguard_exit=cut.exit_code)
    return v, step, last


def summary_lines(v: verdict.Verdict, step: int | None, findings: list[Finding], *, run_dir: Path,
                  duration: float) -> list[str]:
    """The lines said at the run's end: its state, health, findings (open ones first), and its folder."""
    acks = read_acks(run_dir)
    severities = {f.severity for f in findings if f.code not in acks}
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
    head += f" after {duration:.1f} s"
    if step is not None:
        head += f", step {step}"
    head += f"; health {health}"
    lines = [head]
    # an acknowledged finding is listed as such, never counted as an open error beside "health ok"
    errors = [f for f in findings if f.severity == "error" and f.code not in acks]
    warnings = [f for f in findings if f.severity == "warning" and f.code not in acks]
    acked = sum(f.code in acks for f in findings)
    if not findings:
        lines.append("trainguard: no findings")
    else:
        lines.append(f"trainguard: {len(errors)} error(s), {len(warnings)} warning(s)"
                     + (f", {acked} acknowledged" if acked else ""))
        for f in sorted(most_severe_first(findings), key=lambda f: f.code in acks)[:8]:  # open first
            ack = acks.get(f.code)
            lines.append(f"  {f.one_line()}" + (f" (acknowledged by {ack['by']})" if ack else ""))
            if f.where:
                lines.append(f"    where: {f.where}")
            if f.fix:
                lines.append(f"    fix: {f.fix}")
    lines.append(f"trainguard: run folder {run_dir}")
    return lines


def output_failures(run_dir: Path, guard_error: Callable[[str], None]) -> list[Any]:
    """The failures the command printed without a traceback (a CUDA error, `Killed`, a segfault), the
    cause first: the same catalogue `trainguard diagnose` reads a log with (rules/signatures.py)."""
    from trainguard.watchdog.liveoutput import printed_failures

    try:
        return printed_failures(run_dir / "output.log")
    except Exception as exc:  # the guard never becomes the failure: the verdict stands without it
        guard_error(f"could not read the output for its failure: {exc!r}")
        return []


def store_unwritable(writer: StoreWriter, run_dir: Path) -> str | None:
    """Why the run folder takes no writes (a file system gone read-only, permission taken away), or None.
    A full disk is not this: the reserve beside status.json gives the last rows their room."""
    if writer.last_error and not writer.disk_full:
        return writer.last_error
    try:
        fd, name = tempfile.mkstemp(dir=run_dir, prefix=".write-check-")
        os.close(fd)
        os.unlink(name)
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


def all_exited(probe_events: list[dict[str, Any]]) -> bool:
    """Every process whose probe started recorded the interpreter's normal exit (none left by `os._exit`)."""
    started = {e["rank"] for e in probe_events if e["name"] == "start"}
    exited = {e["rank"] for e in probe_events if e["name"] == "exit"}
    return started <= exited


def silent_ranks(probe_events: list[dict[str, Any]], crashes: list[dict[str, Any]]) -> list[int]:
    """Ranks whose probe started but recorded no finish, no exit and no crash: ended by a signal or a
    segfault, or `os._exit` (for the root cause when the others' errors only say they lost a peer)."""
    started = {e["rank"] for e in probe_events if e["name"] == "start"}
    ended = {e["rank"] for e in probe_events if e["name"] in ("finish", "exit")} | {c["rank"] for c in crashes}
    return sorted(r for r in started - ended if isinstance(r, int) and r >= 0)
