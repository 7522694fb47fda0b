"""Stall detection: when has a run made no progress for too long?

Progress is anything that shows the run doing its work: probe steps, forwards of the watched model (an
evaluation over it included), batches fetched through `guard.batches`, phases entered or left,
evaluations and checkpoints; bytes the run writes to its files; new output lines. CPU use is never
progress: seed 000's process burned 4466% CPU for 13 minutes and did nothing.

The timeout learns from the run itself: ten times the longest gap between progress marks seen so far
(a long evaluation that marks progress keeps it short; one that does not lengthens the gaps the next
time), never less than `min_timeout`, and a generous `startup_timeout` until the first optimizer step
(imports, data preparation, model building, compilation), whatever the script prints before it.
`--stall-timeout` replaces all of this with a fixed number.

Passing the timeout makes a stall a finding; whether the run is stopped is decided apart, on proof or
past a per-phase limit (watchdog/stop.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from trainguard.contract import EVENT_DEVICE, EVENT_DEVICE_SAMPLE
from trainguard.findings import WATCHDOG, Code, Finding

if TYPE_CHECKING:  # hang.py (the stacks and their diagnosis) imports this module
    from trainguard.store.reader import RunReader
    from trainguard.watchdog.hang import StallDiagnosis


@dataclass
class StallPolicy:
    fixed: float | None = None
    """--stall-timeout: a fixed number of seconds, or None to learn from the run."""
    min_timeout: float = 60.0
    startup_timeout: float = 300.0
    fixed_startup_floor: float = 60.0
    """With --stall-timeout, the least time allowed before the first progress mark."""
    factor: float = 10.0
    longest_gap: float = 0.0
    phase_longest: dict[str, float] = field(default_factory=dict)
    first_gap: float = 0.0
    """The gap before the second mark (a first step's compilation): not learned from, but the run did it."""
    gaps_in: dict[str, int] = field(default_factory=dict)
    """Gaps learned in each phase ("" outside any); the first is the way in, so a phase has a pace of its
    own from the second on (`has_pace`)."""
    _last_mark: float | None = None
    _gaps_seen: int = 0

    def observe(self, t_progress: float | None, phase: str | None, *, startup: bool = False) -> None:
        """Feed the newest progress time; gaps between consecutive marks teach the timeout.

        `startup`: the run has made no optimizer step yet (imports are done, the probe may have marked a
        phase or a batch). Nothing is learned from it: until the first step the generous startup timeout
        holds (a `torch.compile`, NCCL set-up or a first batch can take minutes), unless --stall-timeout
        fixed the number.
        The first gap between real marks is not learned from either: it holds whatever the first step
        did once (compilation, warm-up) and would inflate the timeout for the rest of the run.
        """
        if t_progress is None:
            return
        if startup:
            # a mark all the same (the fixed timeout's import floor is over), but nothing to learn from
            self._last_mark = max(self._last_mark or t_progress, t_progress)
            return
        if self._last_mark is not None and t_progress > self._last_mark:
            gap = t_progress - self._last_mark
            self._gaps_seen += 1
            if self._gaps_seen > 1:
                self.longest_gap = max(self.longest_gap, gap)
                self.gaps_in[phase or ""] = self.gaps_in.get(phase or "", 0) + 1
                if phase:
                    self.phase_longest[phase] = max(self.phase_longest.get(phase, 0.0), gap)
            else:
                self.first_gap = gap
        if self._last_mark is None or t_progress > self._last_mark:
            self._last_mark = t_progress

    def has_pace(self, phase: str | None) -> bool:
        return self.gaps_in.get(phase or "", 0) >= 2

    def timeout(self, phase: str | None = None, *, startup: bool = False) -> float:
        if self.fixed is not None:
            # Before any progress mark the script is still importing (torch's first import alone can take
            # seconds on a loaded machine): a short fixed timeout gets a floor. Once the probe has started
            # (or the script printed), the user's number holds as given.
            if self._last_mark is None:
                return max(self.fixed, self.fixed_startup_floor)
            return self.fixed
        if self._last_mark is None or startup:
            return self.startup_timeout
        learned = self.factor * max(self.longest_gap, self.phase_longest.get(phase or "", 0.0))
        return max(self.min_timeout, learned)

    def stalled(self, now: float, t_progress: float | None, started: float, phase: str | None = None,
                *, startup: bool = False) -> float | None:
        """Seconds without progress when that exceeds the timeout, else None."""
        since = t_progress if t_progress is not None else started
        idle = now - since
        return idle if idle > self.timeout(phase, startup=startup) else None


def stalled_finding(hang: Finding, *, limit: float, basis: str) -> Finding:
    """TG509 run-stalled: no progress for longer than the stall timeout, with no proof yet that it is stuck.

    What it detects: the run made no progress (steps, forwards of the watched model, batches, phases,
    evaluations, checkpoints, bytes written, output lines) for longer than the stall timeout while its
    process lives, and the stacks taken then do not prove that it cannot go on by itself.
    Why it matters: a stall is worth knowing about at once (seed 003 sat hung for 7.8 hours), but a healthy
    run can be quiet for long (a first evaluation, a slow save, a wait for a file): stopping it on a
    guess would cost a healthy run. The run goes on; trainguard keeps looking and stops it on proof (a lock
    cycle, mismatched collectives, a dead DataLoader worker, the same frames far longer than anything the
    run did) or when the stall outlasts its limit (`--hang-limit`, or learned per phase).
    Example: no progress for 64 s (stall timeout 60 s) at step 1200, phase 'eval'; cause sleep: pid 4121
    sleeps at train.py:88; not stopped: the limit is 1800 s (phase 'eval' never seen before in this run).
    What to change: read the stacks (stacks/ in the run folder) and the cause: if the run should not wait
    there, fix the code at `where`; if the wait is expected, mark progress in it (`guard.batches` over its
    loader, `guard.phase`) or give its phase a limit (`--hang-limit eval=7200`). When progress comes back,
    the finding is kept as info with how long the stall lasted.
    Known false positives: none that stop a run; a stall that ends by itself is reported as info.
    """
    ev = dict(hang.evidence or {})
    ev["stop_limit"] = round(limit, 1)
    ev["stop_limit_basis"] = basis
    return Finding.of(
        RUN_STALLED, step=hang.step,
        summary=f"{hang.summary}; not stopped: no proof that it cannot recover; limit {limit:.0f} s ({basis})",
        evidence=ev, fix=hang.fix, cause=hang.cause, where=hang.where, source="watchdog",
    )


RUN_STALLED = Code("TG509", "run-stalled", "warning", needs=(WATCHDOG,), page=stalled_finding)


def stall_ended(finding: Finding, *, seconds: float, how: str) -> None:
    """A stall that ended by itself: the finding stays, as info, with how long it lasted (slow, not hung)."""
    finding.severity = "info"
    finding.evidence["stall_ended_after"] = round(seconds, 1)
    finding.evidence["stall_ended_by"] = how
    finding.summary += f"; it ended by itself after {seconds:.0f} s ({how}): slow, not hung"


@dataclass(frozen=True)
class Stall:
    """One stall as the supervisor sees it when it looks: how long, against which timeout, where the run was."""

    idle: float
    timeout: float
    step: int | None
    phase: str | None
    last_progress: float
    pid: int
    attempt: int = 0


def hang_finding(stall: Stall, looked: StallDiagnosis | None = None, *, stopped_because: str | None = None) -> Finding:
    """TG502 run-hung: the process is alive but has made no progress for longer than the stall timeout.

    What it detects: no progress for longer than the stall timeout while the process lives, and either
    proof that it cannot recover by itself (a lock cycle, a wait nothing can end, ranks in different
    collectives, a dead or blocked DataLoader worker, the same frames far longer than anything the run did)
    or a stall that outlasted its limit (`--hang-limit`, or learned per phase). trainguard stopped the run
    (unless `--on-hang wait`). A stall without that proof is TG509 run-stalled and the run goes on.
    Why it matters: seed 000 sat hung for 20 minutes and seed 003 for 7.8 hours before anyone looked.
    Example: no progress for 61 s (timeout 60 s) at step 1320, phase 'train'; cause dataloader-worker:
    the training process waits for a batch at train.py:88; DataLoader worker pid 4121 is blocked in the
    dataset at data.py:57 (__getitem__), sample index 48211.
    What to change: the stacks of every process at the stall are in the run folder (stacks/hang-N.txt);
    `cause` (dataloader-worker, collective, deadlock, busy-loop, device-sync, io, sleep, unknown) and
    `where` (the innermost frame in your code) say where it waits, and `fix` is written for the cause
    (watchdog/classify.py). `--on-hang wait` keeps the process alive for a debugger; `--on-hang restart`
    resumes from the newest checkpoint.
    Known false positives: a wait that outlasts a `--hang-limit` set too short for it; without one, a
    phase the run has been through that now stays quiet more than five times its longest before (and
    more than ten minutes).
    """
    process = looked.process_summary() if looked is not None else {"pid": stall.pid}
    cpu = process.get("cpu_percent")
    busy = ""
    if cpu is not None:
        busy = "; it is burning CPU (busy, not waiting)" if cpu > 50 else "; it is idle (waiting on something)"
    at = f" at step {stall.step}" if stall.step is not None else ""
    ph = f", phase '{stall.phase}'" if stall.phase else ""
    evidence = {
        "seconds_without_progress": round(stall.idle, 1),
        "stall_timeout": round(stall.timeout, 1),
        "last_progress_at": stall.last_progress,
        "detected_at": time.time(),
        **{k: v for k, v in process.items() if v is not None},
        **(looked.evidence() if looked is not None else {}),
    }
    summary = f"no progress for {stall.idle:.0f} s (stall timeout {stall.timeout:.0f} s){at}{ph}{busy}"
    cause, where = "unknown", None
    fix = ("Look at the stacks taken at the stall (stacks/ in the run folder) to see where it waits;"
           " the cause and where it is stuck decide the fix.")
    if looked is not None:  # the stacks named a cause: its place and its own fix (watchdog/classify.py)
        d = looked.diagnosis
        cause, where, fix = d.cause, d.where, d.fix
        summary += f"; cause {d.cause}: {d.detail}"
    if stall.attempt:
        evidence["attempt"] = stall.attempt
    if stopped_because:
        evidence["stopped_because"] = stopped_because
        summary += f"; stopped: {stopped_because}"
    return Finding.of(RUN_HUNG, step=stall.step, summary=summary, evidence=evidence, fix=fix, cause=cause,
                      where=where, source="watchdog")


RUN_HUNG = Code("TG502", "run-hung", "error", needs=(WATCHDOG,), page=hang_finding)


def with_devices(f: Finding, reader: RunReader, guard_error: Callable[..., None]) -> None:
    """A stall or hang, told whether a device event came with it (rules/devices.py): the events are the
    probes' rows in the store; the symptom's moment is the last progress before it."""
    from trainguard.rules.devices import DeviceTimeline, annotate

    symptoms = frozenset({RUN_STALLED.name, RUN_HUNG.name})
    if f.name not in symptoms:
        return
    try:
        timeline = DeviceTimeline()
        for kind in (EVENT_DEVICE_SAMPLE, EVENT_DEVICE):
            for ev in reader.events(kind)[-2000:]:
                timeline.note(ev)
        since = (f.evidence or {}).get("last_progress_at")
        if isinstance(since, (int, float)):  # the stall's whole length counts, not only what came before
            annotate(f, timeline, since, after=max(0.0, time.time() - since), symptoms=symptoms)
        else:
            annotate(f, timeline, f.t, symptoms=symptoms)
    except Exception as exc:
        guard_error(f"device attribution failed: {exc!r}", kind="device attribution")
