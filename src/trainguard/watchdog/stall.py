"""Stall detection: when has a run made no progress for too long?

Progress is training progress only: probe steps, batches fetched, phases entered or left, evaluations and
checkpoints for an instrumented script; new output lines for one without the probe. CPU use is never
progress: seed 000's process burned 4466% CPU for 13 minutes and did nothing.

The timeout learns from the run itself: ten times the longest gap between progress marks seen so far
(a long evaluation that fetches batches keeps marking progress; one that does not lengthens the gaps the
next time), never less than `min_timeout`, and a generous `startup_timeout` before the first mark
(imports, data loading, model building). `--stall-timeout` replaces all of this with a fixed number.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from trainguard.findings import Finding


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
    _last_mark: float | None = None

    def observe(self, t_progress: float | None, phase: str | None) -> None:
        """Feed the newest progress time; gaps between consecutive marks teach the timeout."""
        if t_progress is None:
            return
        if self._last_mark is not None and t_progress > self._last_mark:
            gap = t_progress - self._last_mark
            self.longest_gap = max(self.longest_gap, gap)
            if phase:
                self.phase_longest[phase] = max(self.phase_longest.get(phase, 0.0), gap)
        if self._last_mark is None or t_progress > self._last_mark:
            self._last_mark = t_progress

    def timeout(self, phase: str | None = None) -> float:
        if self.fixed is not None:
            # Before the first progress mark the script is still importing and building (torch's first
            # optimizer alone can take seconds on a loaded machine): a short fixed timeout gets a floor.
            return self.fixed if self._last_mark is not None else max(self.fixed, self.fixed_startup_floor)
        if self._last_mark is None:
            return self.startup_timeout
        learned = self.factor * max(self.longest_gap, self.phase_longest.get(phase or "", 0.0))
        return max(self.min_timeout, learned)

    def stalled(self, now: float, t_progress: float | None, started: float, phase: str | None = None) -> float | None:
        """Seconds without progress when that exceeds the timeout, else None."""
        since = t_progress if t_progress is not None else started
        idle = now - since
        return idle if idle > self.timeout(phase) else None


def hang_finding(*, idle: float, timeout: float, step: int | None, phase: str | None, last_progress: float,
                 process: dict[str, Any], extra: dict[str, Any] | None = None) -> Finding:
    """TG502 run-hung: the process is alive but has made no progress for longer than the stall timeout.

    What it detects: no training progress (steps, batches, phases, evaluations, checkpoints; output lines
    for scripts without the probe) for longer than the stall timeout, while the process lives.
    Why it matters: seed 000 sat hung for 20 minutes and seed 003 for 7.8 hours before anyone looked.
    Example: no progress for 61 s (timeout 60 s) at step 1320, phase 'train'; cause dataloader-worker:
    the training process waits for a batch at train.py:88; DataLoader worker pid 4121 is blocked in the
    dataset at data.py:57 (__getitem__), sample index 48211.
    What to change: the stacks of every process at the stall are in the run folder (stacks/hang-N.txt);
    `cause` (dataloader-worker, collective, deadlock, busy-loop, device-sync, io, sleep, unknown) and
    `where` (the innermost frame in your code) say where it waits, and `fix` is written for the cause
    (watchdog/classify.py). `--on-hang wait` keeps the process alive for a debugger; `--on-hang restart`
    resumes from the newest checkpoint.
    Known false positives: a step, evaluation or save that is merely slower than a fixed
    `--stall-timeout` (a save that keeps writing and workers still starting up are given more time).
    """
    cpu = process.get("cpu_percent")
    busy = ""
    if cpu is not None:
        busy = "; it is burning CPU (busy, not waiting)" if cpu > 50 else "; it is idle (waiting on something)"
    at = f" at step {step}" if step is not None else ""
    ph = f", phase '{phase}'" if phase else ""
    evidence = {
        "seconds_without_progress": round(idle, 1),
        "stall_timeout": round(timeout, 1),
        "last_progress_at": last_progress,
        "detected_at": time.time(),
        **{k: v for k, v in process.items() if v is not None},
        **(extra or {}),
    }
    return Finding(
        code="TG502", name="run-hung", severity="error", step=step,
        summary=f"no progress for {idle:.0f} s (stall timeout {timeout:.0f} s){at}{ph}{busy}",
        evidence=evidence,
        fix="Look at the stacks taken at the stall (stacks/ in the run folder) to see where it waits;"
            " the cause and where it is stuck decide the fix.",
        cause="unknown", source="watchdog",
    )
