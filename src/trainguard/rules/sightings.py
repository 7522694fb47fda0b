"""Findings from failure signatures seen in a process's output (rules/signatures.py): TG501, TG503, TG711.

A failure that left no Python traceback (a CUDA error from C++, a segfault, the OOM killer, a job cut off
at its time limit, a container that never started) becomes the same findings a traceback or an exit
signal does: `run-crashed` when the program failed by itself or never started, `run-killed` when
something outside ended it (the OOM killer, a signal, its job scheduler: state `cut-off`), and `node-lost`
for a node's failure, as the live watchdog says it (rules/scheduler.py). The finding quotes the line
and its number, names the state, gives the fix for that cause, and lists the later failure lines as
consequences. `trainguard diagnose` builds it from a log, the watchdog from the command's output.
"""

from __future__ import annotations

import re
from typing import Any

from trainguard.findings import Finding
from trainguard.rules.crash import RUN_CRASHED, crash_finding
from trainguard.rules.ending import RUN_KILLED
from trainguard.rules.scheduler import node_lost
from trainguard.rules.signatures import CUT_OFF, KILLED, LAUNCH_FAILED, Sighting, exception_of

STATE_WORDS = {"crashed": "crashed", KILLED: "was killed", CUT_OFF: "was cut off by its job scheduler",
               LAUNCH_FAILED: "failed to launch"}


def state_of(first: Sighting, progress_before: int | None = None) -> str:
    """The state a failure implies; a launch failure after training steps is a crash (a module imported
    late, a script run by the training script itself)."""
    if first.state == LAUNCH_FAILED and (progress_before if progress_before is not None else first.progress):
        return "crashed"
    return first.state


def sighting_finding(failures: list[Sighting], *, path: str = "the output", step: int | None = None,
                     source: str = "diagnose") -> Finding:
    """TG501 run-crashed or TG503 run-killed for the first failure of `failures`; the rest are consequences."""
    first, later = failures[0], failures[1:]
    state = state_of(first)
    sig = first.signature
    quote = first.text if len(first.text) <= 240 else first.text[:240] + "…"
    evidence: dict[str, Any] = {"line": first.lineno, "quote": first.text, "state": state}
    if later:
        evidence["consequences"] = [f"line {s.lineno}: {s.text[:200]}" for s in later[:8]]
    bare = exception_of(first.text)
    if bare is not None and state == "crashed":
        # a bare exception line with no traceback: the crash finding a traceback would give, without frames
        f = crash_finding(exception=bare[0], message=bare[1], frames=[], step=step, source=source)
        f.summary = f"{path} line {first.lineno}: {f.summary} (no traceback in the output)"
        if f.cause is None:
            f.fix = sig.fix if not sig.cause else f.fix
        f.evidence.update(evidence)
        return f
    words = STATE_WORDS.get(state, state)
    summary = f"the run {words}: {sig.meaning} ({path} line {first.lineno}: \"{quote}\")"
    if later:
        summary += f"; {len(later)} later failure line(s) are consequences"
    if state == CUT_OFF:
        return _scheduler_cut(first, summary=summary, evidence=evidence, step=step, source=source)
    rule = RUN_KILLED if state == KILLED else RUN_CRASHED
    return Finding.of(rule, step=step, summary=summary, evidence=evidence, fix=sig.fix, cause=sig.cause or None,
                      source=source)


_ON_NODE = re.compile(r"\*\*\* (?:JOB|STEP) \S+ ON (\S+) CANCELLED")


def _scheduler_cut(first: Sighting, *, summary: str, evidence: dict[str, Any], step: int | None,
                   source: str) -> Finding:
    """The scheduler's cut: TG711 node-lost for a node's failure (slurmstepd's line names the node, as the
    live watchdog names it: rules/scheduler.py), TG503 run-killed with its cause for the rest."""
    sig = first.signature
    if sig.cause == "node-failure":
        m = _ON_NODE.search(first.text)
        node = m.group(1) if m else None
        if node:
            evidence["lost_nodes"] = [node]
        return node_lost(summary=summary, evidence=evidence, fix=sig.fix, step=step, source=source,
                         cause=sig.cause, where=f"node {node}" if node else None)
    # a cut in a log read afterwards stays TG503 run-killed (state cut-off, the cause time-limit, preempted or
    # cancelled): what readers of logs expect of a run its scheduler ended; the live watchdog, which knows the
    # job's warning signal and whether a checkpoint was saved, says TG552 for the same event
    return Finding.of(RUN_KILLED, step=step, summary=summary, evidence=evidence, fix=sig.fix,
                      cause=sig.cause or None, source=source)


def launcher_only(crash: Finding) -> bool:
    """A crash finding that only has a launcher's word for it: torchrun's ChildFailedError summary, whose
    rank's traceback is not in the output (what the output printed says more)."""
    return crash.exception == "ChildFailedError"


def enrich(finding: Finding, failures: list[Sighting], *, path: str = "output.log") -> Finding:
    """A crash or kill finding the watchdog made from the exit alone, told the cause its output printed."""
    first = failures[0]
    sig = first.signature
    if not sig.cause or sig.weak:
        # the line only restates how the process ended (`Killed`, an exit code): evidence, not a cause
        finding.evidence.setdefault("line", first.lineno)
        finding.evidence.setdefault("quote", first.text)
        return finding
    finding.cause = sig.cause
    finding.fix = sig.fix
    finding.summary += f"; its output says why: {sig.meaning} ({path} line {first.lineno}: \"{first.text[:200]}\")"
    finding.evidence.update({"line": first.lineno, "quote": first.text, "state": state_of(first)})
    if len(failures) > 1:
        finding.evidence["consequences"] = [f"line {s.lineno}: {s.text[:200]}" for s in failures[1:9]]
    return finding
