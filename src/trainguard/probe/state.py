"""What every part of the probe shares: whose process it is, whether it is switched off, its own errors,
its progress counters, and whether the device can still be read.

Each part (the step assembler, the drain, the optimizer hooks, the flight-recorder responder, the endings)
is handed this object and the one or two collaborators it uses; none is handed another part whole. The
training thread writes the counters, the background thread reads them: plain attributes, no lock (an
int's store is atomic under the interpreter lock, and a count read one step late is harmless).
"""

from __future__ import annotations

import os
import time

from trainguard.store.selflog import GuardLog

MAX_GUARD_ERRORS = 20  # past this many of its own errors the guard switches itself off


class ProbeState:
    """One training process's probe: its pid, its switch, its error count and its progress."""

    def __init__(self, selflog: GuardLog) -> None:
        self.selflog = selflog
        self.pid = os.getpid()  # the process the probe records; a forked child counts nothing
        self.disabled = False  # switched off (too many errors of its own, a forked child, retired)
        self.errors = 0
        # counters: micro-batches seen, optimizer steps seen by the hooks, steps closed by `guard.step`.
        # Counting goes on even when the guard switched itself off: the loop's `due()` depends on it.
        self.micro = 0
        self.opt_steps = 0
        self.loss_steps = 0
        # Progress. The hot calls (`step`, each batch, each forward, each optimizer step) count it in
        # `ticks` rather than read a clock (a clock read costs ~2 us in a real loop's cold cache, and there
        # are a dozen of them a step); the background thread turns a count that moved into the time of its
        # pass (at most a flush interval late: a stall then looks shorter, never longer). Rare calls (phases,
        # evaluations, checkpoints) set `t_progress` themselves.
        self.ticks = 0
        self.ticks_seen = 0
        self.t_progress: float | None = None
        self.device_broken = False  # a sticky device error: no device value is read again
        self.finished = False
        self.crashed = False

    @property
    def step_count(self) -> int:
        """Optimizer steps done so far."""
        return max(self.opt_steps, self.loss_steps)

    def progress_time(self) -> float | None:
        """The time of the last progress: the rare calls' own times, or this pass's if the count moved
        (background thread)."""
        ticks = self.ticks
        if ticks != self.ticks_seen:
            self.ticks_seen = ticks
            self.t_progress = max(self.t_progress or 0.0, time.time())
        return self.t_progress

    def fail(self, where: str, exc: BaseException) -> None:
        """One of the guard's own errors: logged (de-duplicated), and counted toward switching itself off."""
        self.errors += 1
        self.selflog.error(where, exc)
        if self.errors >= MAX_GUARD_ERRORS and not self.disabled:
            self.disabled = True
            self.selflog.write(f"too many errors ({self.errors}): the guard switched itself off")
