"""The truthful final state of a run. Silence is never success.

- completed: exit 0, the probe (if the script used one) finished, every expected artifact exists and was
  written during this run;
- failed:    exit 0, but an artifact is missing or stale, or the probe never finished and something says the
  script stopped early (seed 000's monitor said "Training complete" while the results file was never
  written); a script that merely forgot `guard.finish()` is completed, with a warning (rules/ending.py);
- crashed:   non-zero exit;
- killed:    ended by a signal that trainguard did not send for a hang;
- hung:      no progress for longer than the stall timeout (trainguard stopped it, or it is still alive).

`trainguard run` exits with the command's own code when the command crashed (128 + N for a signal, as
shells do), and with the codes of trainguard/exitcodes.py otherwise.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainguard import exitcodes
from trainguard.findings import EXPECTS, WATCHDOG, Code, Finding
from trainguard.rules.crash import RUN_CRASHED
from trainguard.rules.ending import RUN_KILLED, killed_finding, probe_not_finished, signal_name
from trainguard.rules.sightings import enrich, launcher_only, sighting_finding
from trainguard.rules.signatures import CUT_OFF, KILLED, Sighting
from trainguard.store.ending import Ending, state_of

if TYPE_CHECKING:
    from trainguard.contract import State

EXIT_FAILED = exitcodes.FAILED
EXIT_HUNG = exitcodes.HUNG
EXIT_STOPPED = exitcodes.STOPPED


@dataclass
class Verdict:
    state: State
    exit_code: int | None
    signal: str | None
    findings: list[Finding] = field(default_factory=list)
    trainguard_exit: int = 0
    ending: Ending = field(default_factory=Ending)  # the facts the state was named from (for status.json)


def check_artifacts(expects: list[str], started: float, cwd: str | None = None) -> list[Finding]:
    """TG504 artifact-missing / TG505 artifact-stale: every `--expect` path must exist and be new.

    What it detects: an expected output (a results file, a final checkpoint) that does not exist when the
    command exits 0 (missing), or exists but was not written during this run (stale: left by an earlier
    run).
    Why it matters: seed 000's orchestrator waited 20 minutes for phase3_stage3a_comparison.json, which was
    never created, while its monitor said "Training complete".
    Example: --expect results/comparison.json: missing when the command exited 0 after 312 s.
    What to change: find why the script ended before writing it; the run's output.log and findings say
    where it stopped.
    """
    findings = []
    base = Path(cwd) if cwd else Path.cwd()
    for raw in expects:
        path = Path(raw)
        if not path.is_absolute():
            path = base / path
        try:
            st = path.stat()
        except FileNotFoundError:
            findings.append(Finding.of(
                ARTIFACT_MISSING,
                summary=f"expected artifact {raw} does not exist although the command exited 0",
                evidence={"path": str(path), "exists": False},
                fix=f"The script ended without writing {raw}. Check the end of output.log and the last phase;"
                    " make the script fail loudly (non-zero exit) when it cannot write its results.",
                source="watchdog",
            ))
            continue
        except OSError as exc:
            findings.append(Finding.of(
                ARTIFACT_MISSING,
                summary=f"expected artifact {raw} cannot be read: {exc.strerror}",
                evidence={"path": str(path), "error": str(exc)}, fix="Check the path and its permissions.",
                source="watchdog",
            ))
            continue
        # one second of slack: some filesystems keep mtimes at a coarse resolution
        if st.st_mtime < started - 1.0:
            age = started - st.st_mtime
            findings.append(Finding.of(
                ARTIFACT_STALE,
                summary=f"expected artifact {raw} was not written during this run (last written {age:.0f} s before it started)",
                evidence={"path": str(path), "mtime": st.st_mtime, "run_started": started,
                          "written_before_start_s": round(age, 1)},
                fix=f"The file is left over from an earlier run; this run never wrote {raw}. Find where it stopped"
                    " (output.log, last phase) and delete stale outputs before a run.",
                source="watchdog",
            ))
    return findings


ARTIFACT_STALE = Code("TG505", "artifact-stale", "error", needs=(EXPECTS,), page=check_artifacts)


ARTIFACT_MISSING = Code("TG504", "artifact-missing", "error", needs=(EXPECTS,), page=check_artifacts)




def leftover_finding(members: list[dict[str, Any]], step: int | None) -> Finding:
    """TG508 leftover-processes: processes of the run outlived its main process.

    What it detects: when the command's main process has exited, members of its process group still
    running (a background job, a worker or server the script started and never stopped).
    Why it matters: a leftover process holds GPU memory, ports and files, keeps writing to the run's
    output, and makes the next run fail in ways that look unrelated; a run is not over while its
    processes live.
    Example: the main process exited 0; 1 process left: pid 4121 `sleep 30`.
    What to change: stop what the script started before it exits (join workers, close servers, shut
    down DataLoader workers); trainguard stops the leftovers itself (SIGTERM, then SIGKILL).
    """
    shown = [f"pid {m.get('pid')} {' '.join(m.get('cmdline') or [])[:120]}" for m in members[:10]]
    return Finding.of(
        LEFTOVER_PROCESSES, step=step,
        summary=f"{len(members)} process(es) of the run were still running after its main process exited;"
                " trainguard stopped them",
        evidence={"processes": shown, "count": len(members)},
        fix="Stop what the script started before it exits: join worker processes and threads, close servers,"
            " shut down DataLoader workers.",
        source="watchdog",
    )


LEFTOVER_PROCESSES = Code("TG508", "leftover-processes", "warning", needs=(WATCHDOG,), page=leftover_finding)


def decide(
    *,
    returncode: int,
    hang: Finding | None,
    stopped_on: Finding | None,
    probe_used: bool,
    probe_finished: bool,
    probe_crash: Finding | None,
    stderr_crash: Finding | None,
    expects: list[str],
    started: float,
    cwd: str | None,
    step: int | None,
    oom: dict[str, Any],
    store_unwritable: str | None = None,
    forwarded: int | None = None,
    probe_exited: bool = True,
    total_steps: int | None = None,
    printed: list[Sighting] | None = None,
) -> Verdict:
    """The final state from how the process ended and what the probe and the files say (the state itself
    is named by store/ending.py's `state_of`, from the same facts).

    `store_unwritable`: why the run folder stopped taking writes, if it did; then a finish the probe
    could not store is no sign that the script left early.

    `forwarded`: an ending signal trainguard passed on to the command (Ctrl-C, `timeout`, a scheduler's
    SIGTERM). When a launcher turned it into an exception and exit code 1 (torchrun's SignalException),
    the run was killed by that signal: the tracebacks it printed are its consequence, not a crash to fix.

    `probe_exited`: every process whose probe started recorded the interpreter's normal exit; with
    `total_steps` (declared) they say whether an unfinished guard is an early end (rules/ending.py).

    `printed`: the failures the command's output shows without a traceback (rules/signatures.py), the
    cause first: they name the cause of a death by signal (`CUDA error: out of memory` before an abort)
    or of an exit with no traceback; a shell's `Killed` with exit 137 (128 + SIGKILL) is a kill."""
    if forwarded is not None and returncode > 0 and hang is None and stopped_on is None:
        returncode, probe_crash, stderr_crash = -forwarded, None, None
    sig = -returncode if returncode < 0 else None
    if sig is None and printed and returncode - 128 in (signal.SIGKILL, signal.SIGTERM) \
            and printed[0].state in (KILLED, CUT_OFF):
        sig = returncode - 128  # a shell or launcher between us and the process said how it died
    facts = Ending(exit_code=returncode if returncode >= 0 else None, signal=signal_name(sig) if sig else None,
                   # a finish the probe could not store is unknown, not missing: its probe is no witness then
                   probe_used=probe_used and store_unwritable is None, probe_finished=probe_finished)
    if hang is not None:
        return _verdict(replace(facts, hung=True), returncode, [hang], EXIT_HUNG)
    if stopped_on is not None:
        return _verdict(replace(facts, stopped=True), returncode, [stopped_on], EXIT_STOPPED)
    if sig is not None:
        killed = killed_finding(sig, step=step, oom=oom)
        if printed:
            enrich(killed, printed)
        return _verdict(replace(facts, signal=signal_name(sig)), returncode, [killed], exitcodes.SIGNAL_BASE + sig)
    if returncode != 0:
        crash = probe_crash or stderr_crash
        if crash is not None and crash.code == RUN_KILLED.code:
            # one rank killed (rules/killedrank.py): the run was killed, though its launcher exited with 1
            crash.evidence.setdefault("exit_code", returncode)
            return _verdict(replace(facts, signal=crash.evidence.get("signal") or "SIGKILL"), returncode, [crash],
                            returncode)
        if printed and crash is not None and launcher_only(crash):
            crash = None  # torchrun's summary without the rank's traceback: the printed line says how it ended
        if crash is None and printed:
            crash = sighting_finding(printed, path="output.log", step=step, source="watchdog")
            crash.summary = f"the command exited with code {returncode}: {crash.summary}"
        elif crash is not None and crash.cause is None and printed:
            enrich(crash, printed)
        if crash is None:
            crash = Finding.of(
                RUN_CRASHED, step=step,
                summary=f"the command exited with code {returncode} without a Python traceback",
                evidence={"exit_code": returncode},
                fix="Read the end of output.log in the run folder: the command said why, or said nothing.",
                source="watchdog",
            )
        else:
            crash.evidence.setdefault("exit_code", returncode)
        return _verdict(facts, returncode, [crash], returncode)
    findings = check_artifacts(expects, started, cwd)
    missing = bool(findings)
    forgotten = False
    if probe_used and not probe_finished and store_unwritable is None:
        unfinished = probe_not_finished(step, total_steps=total_steps, exited_normally=probe_exited)
        forgotten = unfinished.severity != "error"
        findings.append(unfinished)
    ending = replace(facts, artifacts_missing=missing, finish_forgotten=forgotten)
    failed = any(f.severity == "error" for f in findings)
    return _verdict(ending, 0, findings, EXIT_FAILED if failed else 0)


def cut_off(cause: str, returncode: int, finding: Finding, *, trainguard_exit: int) -> Verdict:
    """The run its job scheduler cut off (a time limit, a preemption, a requeue, a node's failure): the state
    `cut-off` whatever the command did with the signal (caught it and exited 0 or 1, or died of it); the
    finding (TG552, or TG711 for a node's failure) replaces run-killed and any crash it caused."""
    sig = -returncode if returncode < 0 else None
    ending = Ending(exit_code=returncode if returncode >= 0 else None, signal=signal_name(sig) if sig else None,
                    cut_by=cause)
    return _verdict(ending, returncode, [finding], trainguard_exit)


def _verdict(ending: Ending, returncode: int, findings: list[Finding], trainguard_exit: int) -> Verdict:
    return Verdict(state_of(ending), returncode, ending.signal, findings, trainguard_exit, ending)
