"""`trainguard diagnose PATH` for what trainguard never watched: a log, an output folder, a metrics file.

    trainguard diagnose train.log            trainguard diagnose out/        (a Hugging Face output folder)
    trainguard diagnose lightning_logs/      trainguard diagnose runs/exp1/results.csv --json

The reader's events go through the same rules engine as a live run, one event at a time: a 1 GB log
is read in constant memory (the rules keep bounded state; see benchmarks/diagnose_big_log.py). Then what only a log can show:
a traceback (the watchdog's own `run-crashed`), a log that stops without completing, PyTorch's own
warnings. The report names the rules that could not run because the log lacks their data.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainguard.findings import CHECKPOINTS, Finding, most_severe_first
from trainguard.ingest.encoding import unit, wide_encoding
from trainguard.ingest.events import EVENT_LAUNCH, Source
from trainguard.rules.ending import RUN_KILLED
from trainguard.rules.sightings import launcher_only, sighting_finding, state_of
from trainguard.rules.signatures import KILLED, LAUNCH_FAILED, Sighting, signature_of

# "done", "Done.", "all done!", "finished": printed alone as a script's last line, its end (anywhere else, a
# "done" line may close a data-preparation step long before the run ended)
_LAST_WORD_DONE = re.compile(r"(?i)^(?:all |training )?(?:done|finished|complete|completed)[.!]*$")


@dataclass
class Diagnosis:
    path: Path
    format: str
    # completed | crashed | killed | cut-off (its job scheduler ended it) | launch-failed | unfinished | unknown
    state: str
    findings: list[Finding]
    not_run: list[tuple[str, str]] = field(default_factory=list)  # (rule name, the data it lacked)
    steps: int = 0
    evals: int = 0
    lines: int = 0
    skipped: int = 0
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"path": str(self.path), "format": self.format, "state": self.state, "steps": self.steps,
                "evals": self.evals, "lines": self.lines, "skipped": self.skipped,
                "findings": [f.to_dict() for f in self.findings],
                "not_run": [{"rule": r, "needs": n} for r, n in self.not_run], "notes": self.notes}


def diagnose_source(source: Source, now: float | None = None, rules: bool = True, alive: bool = False) -> Diagnosis:
    """Feeds the source's events to the rules, one at a time, then adds what the log itself shows.

    `rules=False` reads without the health rules (the readers' own cost, for benchmarks). `alive`: the
    user asks whether the run may still be going; only then does the file's modification time count.
    """
    from trainguard.errors import UserError
    from trainguard.ingest import signs

    plan = _with_contract(source.plan, source.format)
    engine, notes = _engine(plan) if rules else (None, ["the health rules were not run"])
    idle = starved(engine, plan) if engine is not None else []
    if engine is not None:
        engine.rules = [r for r in engine.rules if r not in idle]
    found: list[Finding] = []
    last_step: int | None = None
    kinds: set[str] = set()
    # A reader's `launch` event: another launch of the script begins in the same file (a relaunch appended,
    # a fit run again). The log is judged on its last launch that trains: the rules start afresh at each one,
    # and the launch before is kept only until the new one logs a training step.
    trained = False
    before: tuple[Any, list[Finding], int | None] | None = None
    for ev in source.events:
        kind = ev.get("kind") or ""
        if kind == EVENT_LAUNCH:
            if trained or before is None:
                before = (engine, found, last_step)
            engine, found, trained = _fresh(engine, plan, idle), [], False
            continue
        kinds.add(kind)
        if kind == "step":
            last_step = ev.get("step")
            trained = trained or ev.get("loss") is not None
        if engine is not None:
            found.extend(engine.feed(ev))
    if before is not None and not trained:
        engine, found, last_step = before  # the last launch logged no training: the one before it is the run
    if engine is not None:
        found.extend(engine.end())
        notes.extend(engine.errors)
    facts = source.facts
    name = source.path.name
    ending: str | None = None  # how the log shows the run ended, when it shows a failure
    printed = facts.signs.outcome(facts.steps + facts.evals, completed=facts.completed is not None,
                                  traceback=facts.traceback is not None or facts.launch_error is not None)
    killed = _killed_rank(source.path, last_step) if facts.traceback is not None or printed else None
    if killed is not None:
        # a rank killed by SIGKILL (torchrun's table): the cause, before its peers' connection errors
        found.append(killed)
        ending = "killed"
    elif facts.traceback is not None:
        crash = _first_failure(source.path, last_step) or _crash(facts.traceback, last_step)
        finding, ending = _traceback_ending(name, crash, printed, facts.signs.first_traceback_at,
                                            facts.steps + facts.evals, last_step)
        found.append(finding)
    elif facts.launch_error is not None:
        found.append(signs.launch_failed(name, facts.launch_error))
        ending = "launch-failed"
    elif printed:
        sighting = sighting_finding(printed, path=name, step=last_step, source="diagnose")
        found.append(_with_plan_fraction(sighting, facts.cut_off))
        ending = state_of(printed[0])
    crashed = ending is not None
    for (lineno, warning), count in _first_of_each(facts.warnings):
        if warning == signs.SCHEDULER_BEFORE_OPTIMIZER.name:
            found.append(signs.scheduler_before_optimizer(name, lineno, count))
    last_word = facts.last_word or facts.last_line
    if facts.completed is None and last_word and _LAST_WORD_DONE.match(last_word):
        # a script's own last word ("done"), as the log's very last line only (stray `0`, `50` after it aside)
        facts.completed = last_word
    log_like = source.log_like and facts.ends_with != "unknown"  # "unknown": the reader cannot tell how it ended
    if log_like and not crashed and facts.completed is None:
        if not (facts.steps or facts.evals or facts.lines):
            raise UserError(f"{source.path}: nothing trainguard can read in it (no metrics, progress or traceback)")
        found.append(signs.log_ends_unfinished(name, facts.last_line, facts.lines, last_step, ends_with=facts.ends_with,
                                               snapshot=facts.snapshot, mtime=facts.mtime, now=now, alive=alive,
                                               cut_off=facts.cut_off))
    if not (facts.steps or facts.evals or crashed or facts.warnings or facts.completed):
        unit = "lines" if source.log_like or source.format.startswith("text") else "records"
        raise UserError(f"{source.path}: read {facts.lines} {unit} as {source.format} but found no training "
                        "metrics, progress or traceback in them")
    state = ending or ("completed" if facts.completed else "unfinished" if log_like else "unknown")
    # what the source carried, in the names of the rules' needs: the step fields it filled, its events
    have = set(facts.fields) | {k for k in kinds if k not in ("step", "eval")}
    have |= {CHECKPOINTS.key} if "checkpoint" in kinds else set()
    not_run = _not_run(engine, have, plan, idle)
    return Diagnosis(path=source.path, format=source.format, state=state, findings=most_severe_first(escalated(found)),
                     not_run=not_run, steps=facts.steps, evals=facts.evals, lines=facts.lines,
                     skipped=facts.skipped, notes=notes)


def escalated(findings: list[Finding]) -> list[Finding]:
    """One finding per rule that escalated (TG301's warning at the first non-finite loss, then its error once
    the rate passed its limit): the most severe stays, the lesser ones go into its evidence under "earlier"
    (`findings.escalations_merged`, as status.json shows them)."""
    from trainguard.findings import escalations_merged

    return [Finding.from_dict(f) for f in escalations_merged([f.to_dict() for f in findings])]


_FRACTION = re.compile(r"\(([\d.]+)%\)")
SCHEDULER_CUTS = ("time-limit", "preempted", "node-failure")


def _with_plan_fraction(finding: Finding, cut_off: str | None) -> Finding:
    """A run its scheduler cut at its time limit: how much of its plan fit in the job's time, and so about how
    many times that time the whole plan needed (at the pace the log shows)."""
    m = _FRACTION.search(cut_off or "")
    if finding.cause not in SCHEDULER_CUTS or not cut_off:
        return finding
    if m is None:  # a position without the whole plan (`step 1,300 of 8,000 in epoch 1`): said, not projected
        finding.summary += f"; by then it had reached {cut_off}"
        finding.evidence["plan_reached"] = cut_off
        return finding
    fraction = float(m.group(1)) / 100
    finding.summary += f"; by then it had reached {cut_off}"
    finding.evidence["plan_reached"] = cut_off
    if finding.cause == "time-limit" and 0 < fraction < 1:
        finding.summary += f": the whole plan needed about {1 / fraction:.1f}x the time the job was given"
        finding.evidence["plan_needs_x_time"] = round(1 / fraction, 1)
    return finding


def diagnose_path(path: str | Path, now: float | None = None, ended: str | None = None,
                  rules: bool = True, alive: bool = False) -> Diagnosis:
    """`ended`: how the run ended when something else knows (a watchdog's status.json), else None.

    A folder is also asked what its metrics cannot say (`beside`): the scheduler's output files beside them
    decide how the run ended, and a YOLO run folder with its plan but no epoch table yet is a run that never
    finished an epoch."""
    from trainguard.errors import UserError
    from trainguard.ingest import beside
    from trainguard.ingest.detect import open_source

    folder = Path(path) if not ended and Path(path).is_dir() else None
    try:
        source = open_source(path)
        if ended:
            source.facts.completed = ended
        d = diagnose_source(source, now=now, rules=rules, alive=alive)
    except UserError:
        if folder is None:
            raise
        first = beside.before_first_epoch(folder, now=now, alive=alive) or beside.scheduler_log(folder, now, alive)
        if first is None:
            raise
        d = first
    return beside.with_side_logs(d, folder) if folder is not None else d


def _with_contract(plan: dict[str, Any], format_name: str) -> dict[str, Any]:
    """The source's plan and what its format's contract says the rules must know about its losses."""
    from trainguard.ingest.formats import contract

    c = contract(format_name)
    if c is None:
        return plan
    extra: dict[str, Any] = {}
    if c.cross_entropy:
        extra["cross_entropy"] = dict(c.cross_entropy)
    if c.eval_same_loss:
        extra["eval_same_loss"] = True
    if c.lr_decays_only:
        extra["lr_decays_only"] = True
    return {**extra, **plan}


def _fresh(engine: Any, plan: dict[str, Any], idle: list[Any]) -> Any:
    """A new rules engine for the next launch, with the same rules left out as the first."""
    if engine is None:
        return None
    fresh, _ = _engine(plan)
    skip = {type(r) for r in idle}
    fresh.rules = [r for r in fresh.rules if type(r) not in skip]
    return fresh


def _engine(plan: dict[str, Any]) -> tuple[Any, list[str]]:
    try:
        from trainguard.rules.engine import Engine
    except ImportError:  # the health rules are not in this build: only what the log itself shows
        return None, ["the health rules engine is not installed: only log-level findings are reported"]
    return Engine(plan, source="diagnose"), []


def starved(engine: Any, plan: dict[str, Any]) -> list[Any]:
    """Rules that need data no log reader produces (and the plan does not state): they cannot fire on a log,
    and their per-step work would cost time on a long one for nothing."""
    return [r for r in engine.rules if any(not n.in_logs and not plan.get(n.key) for n in r.needs)]


def _not_run(engine: Any, have: set[str], plan: dict[str, Any], idle: list[Any]) -> list[tuple[str, str]]:
    if engine is None:
        return []
    out = []
    for rule in sorted(engine.rules + idle, key=lambda r: r.code):
        lacking = [n.label for n in rule.needs if n.key not in have and not plan.get(n.key)]
        if lacking:
            out.append((rule.name, ", ".join(lacking)))
    return out


TAIL_BYTES = 1 << 20  # the end of a log read again for the failures of several processes


def _first_failure(path: Path, last_step: int | None) -> Finding | None:
    """In a log of several processes (torchrun's ranks), the first to fail is the cause, not the last
    traceback: the end of the log is read again for every process's failure (rules/firstfailure.py).
    None for one process's log, or when the end cannot be read: the last traceback then stands."""
    from trainguard.rules.firstfailure import first_failure_finding

    lines = _tail_lines(path)
    if not lines:
        return None
    finding = first_failure_finding(lines, step=last_step, elapsed=None, source="diagnose")
    return finding if finding is not None and "root_cause_by" in finding.evidence else None


def _killed_rank(path: Path, last_step: int | None) -> Finding | None:
    """TG503 for a rank torchrun reports killed by SIGKILL (rules/killedrank.py), read from the log's end."""
    from trainguard.rules.killedrank import killed_rank_finding

    lines = _tail_lines(path)
    return killed_rank_finding(lines, step=last_step, source="diagnose") if lines else None


def _tail_lines(path: Path) -> list[str]:
    try:
        with open(path, "rb") as fh:
            encoding = wide_encoding(fh.read(4))
            fh.seek(max(0, fh.seek(0, 2) - TAIL_BYTES))
            tail = fh.read(TAIL_BYTES)
        if encoding is not None:  # (a UTF-16 log's tail, cut to whole code units: its text)
            return tail[len(tail) % unit(encoding):].decode(encoding, "replace").splitlines()
        return tail.decode("utf-8", "replace").splitlines()
    except (OSError, ValueError):
        return []


def _traceback_ending(name: str, crash: Finding, printed: list[Sighting], first_traceback: int | None,
                      progress: int, last_step: int | None) -> tuple[Finding, str]:
    """The finding and state of a log that holds a traceback. A failure printed before any traceback, of
    another cause, is the cause and the traceback its consequence (the OOM killer's line, then a DataLoader
    worker's traceback); of the same cause, its line is added (a kernel's `Assertion ... failed` line names
    the operation a device-side assert's traceback does not)."""
    if printed and launcher_only(crash):
        # torchrun's summary without the rank's own traceback: its exit code or signal line says how it ended
        finding = sighting_finding(printed, path=name, step=last_step, source="diagnose")
        finding.evidence.setdefault("consequences", []).append(f"then torchrun's summary: {crash.summary[:200]}")
        return finding, state_of(printed[0])
    before = [s for s in printed if first_traceback is not None and s.lineno < first_traceback
              and not s.signature.weak]
    if before:
        first = before[0]
        if first.cause != crash.cause:
            finding = sighting_finding(printed, path=name, step=last_step, source="diagnose")
            finding.evidence.setdefault("consequences", []).append(f"then a traceback: {crash.summary[:200]}")
            return finding, state_of(first)
        crash.evidence["first_sign"] = f"line {first.lineno}: {first.text[:200]}"
    sig = signature_of(crash.cause)
    if sig is not None and sig.state == LAUNCH_FAILED and not progress:
        return crash, LAUNCH_FAILED  # (a module missing at import: the script never started training)
    if sig is not None and sig.state == KILLED:
        # KeyboardInterrupt's traceback: someone stopped the run (Ctrl-C), the code did not fail; as the live
        # watchdog says of the same end (killed by SIGINT)
        at = f" at {crash.where}" if crash.where else ""
        return Finding.of(RUN_KILLED, step=crash.step, cause=sig.cause, fix=sig.fix, source="diagnose",
                          where=crash.where, evidence=crash.evidence,
                          summary=f"the run was stopped: {sig.meaning} ({crash.exception}{at})"), KILLED
    return crash, "crashed"


def _crash(lines: list[str], last_step: int | None) -> Finding:
    from trainguard.rules.crash import crash_finding, parse_traceback

    parsed = parse_traceback(lines)
    if parsed is None:  # cut off before its exception line
        return crash_finding(exception="Traceback", message="(the log ends inside a traceback)",
                             frames=[], step=last_step, source="diagnose")
    return crash_finding(exception=parsed.exception, message=parsed.message, frames=parsed.frames,
                         step=last_step, source="diagnose")


def _first_of_each(warnings: list[tuple[int, str]]) -> list[tuple[tuple[int, str], int]]:
    seen: dict[str, tuple[int, int]] = {}
    for lineno, name in warnings:
        first, count = seen.get(name, (lineno, 0))
        seen[name] = (first, count + 1)
    return [((first, name), count) for name, (first, count) in seen.items()]


def render(d: Diagnosis, verbose: bool = False) -> list[str]:
    """The report as lines of text: what was read, the findings with their fixes, the rules not run (one
    line; `verbose`: each, with the data it lacked)."""
    head = f"{d.path}: {d.format}, {d.steps} steps, {d.evals} evaluations"
    if d.lines:
        head += f", {d.lines} lines/records"
    if d.skipped:
        head += f" ({d.skipped} unreadable, skipped)"
    out = [head + f"; state: {d.state}"]
    if not d.findings:
        out.append("  no findings")
    for f in d.findings:
        out.append("  " + f.one_line())
        if f.where:
            out.append(f"    where: {f.where}")
        if f.fix:
            out.append(f"    fix: {f.fix}")
    return out + limits(d, verbose)


def limits(d: Diagnosis, verbose: bool = False) -> list[str]:
    """The rules that could not run for lack of data in the source (a count; `verbose`: each, by the data it
    lacked), and the reader's notes, as lines."""
    out = []
    if d.not_run and verbose:
        by_need: dict[str, list[str]] = {}
        for rule, need in d.not_run:
            by_need.setdefault(need, []).append(rule)
        out.append("  rules that could not run, for lack of data in this source:")
        out.extend(f"    no {need}: {', '.join(rules)}" for need, rules in by_need.items())
    elif d.not_run:
        out.append(f"  ({len(d.not_run)} rules need data this source does not hold: --verbose lists them)")
    out.extend(f"  note: {n}" for n in d.notes)
    return out
