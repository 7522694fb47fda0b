"""TG1xx: the learning-rate schedule, checked against the plan and against what the optimizer saw."""

from __future__ import annotations

from typing import Any

from trainguard.findings import Finding
from trainguard.rules.engine import Rule, finite, fmt, median

# An LR below this share of the run's own peak moves nothing. Not 1e-3: the classic step schedule
# (0.1 -> 0.01 -> 0.001 -> 0.0001) ends at exactly 1e-3 of its peak, on purpose.
NEGLIGIBLE = 1e-4
STREAK = 10  # consecutive optimizer steps at a negligible LR before the rule is sure
LEFT_AT_LEAST = 0.05  # a schedule that decays to zero in its last 5% is doing its job


def step_lr(row: dict[str, Any]) -> float | None:
    """The largest LR over the param groups (a group still learning means the run still learns)."""
    lrs = (row.get("extra") or {}).get("lrs")
    values = [v for v in (lrs or []) if finite(v)]
    if finite(row.get("lr")):
        values.append(row["lr"])
    return max(values) if values else None


class LrReachesZero(Rule):
    """TG101 lr-reaches-zero: the learning rate is zero or negligible while optimizer steps continue.

    ## What it detects
    Ten optimizer steps in a row whose learning rate (the largest over the param groups) is 0, or below
    0.01% of the run's own peak LR, while a meaningful part of the planned run is still ahead (more than
    5% of `total_steps`; without a plan, only an LR of exactly 0 counts). The finding names the step
    where the LR reached zero and what share of the planned run is left.

    ## Why it matters
    Every step at LR 0 costs the full compute and changes nothing. Seed 002 trained for hours at
    `lr=0.00e+00`: its scheduler was sized in one unit and stepped in another, reached the end of its
    decay after 6% of the run and held the LR at zero for the other 94%.

    ## Example
    `TG101 lr-reaches-zero [error] at step 293: learning rate is 0 from step 293 on (peak 3.00e-04 at
    step 29) while optimizer steps continue; 94% of the planned 4,687 steps are left`

    ## What to change
    Size the scheduler in optimizer steps (micro-batches / `grad_accum`) and call `scheduler.step()`
    once per optimizer step; give a decaying schedule a floor (`eta_min`, a min-LR ratio) if it may end
    before the run does.

    ## Known false positives
    A run that deliberately freezes learning (LR 0) for a while, e.g. to collect statistics; a
    schedule that decays more than 10,000x while it still has over 5% of the run to go.

    ## Options
    None. The thresholds (0.01% of the peak, 10 steps, 5% of the run left) are fixed.
    """

    code, name, severity = "TG101", "lr-reaches-zero", "error"

    def __init__(self, plan: dict[str, Any]) -> None:
        super().__init__(plan)
        self.peak = 0.0
        self.peak_step: int | None = None
        self.onset: tuple[int, float] | None = None
        self.streak = 0

    def on_step(self, row: dict[str, Any]) -> Finding | None:
        lr, step = step_lr(row), row.get("step")
        if lr is None or step is None:
            return None
        if lr > self.peak:
            self.peak, self.peak_step = lr, step
        if self.total_steps:
            negligible = lr <= 0 or lr <= NEGLIGIBLE * self.peak
        else:
            negligible = lr <= 0  # without a plan a schedule's normal end looks the same
        if not negligible:
            self.streak, self.onset = 0, None
            return None
        self.streak += 1
        if self.onset is None:
            self.onset = (step, lr)
        if self.streak < STREAK:
            return None
        onset, onset_lr = self.onset
        # the onset step itself is one of the wasted ones
        left_share = (self.total_steps - onset + 1) / self.total_steps if self.total_steps else None
        if left_share is not None and left_share < LEFT_AT_LEAST:
            return None
        left = ""
        if self.total_steps:
            left = f"; {left_share:.0%} of the planned {fmt(self.total_steps)} steps are left"
        peak = f"peak {fmt(self.peak)} at step {self.peak_step}" if self.peak > 0 else "it was never above 0"
        return self.finding(
            step=onset,
            summary=f"learning rate is {fmt(onset_lr)} from step {onset} on ({peak}) while optimizer steps "
                    f"continue{left}",
            fix="size the scheduler in optimizer steps (micro-batches / grad_accum) and call scheduler.step() "
                "once per optimizer step; give a decaying schedule a floor if it may end before the run",
            evidence={"lr": onset_lr, "onset_step": onset, "detected_step": step, "peak_lr": self.peak,
                      "peak_step": self.peak_step, "total_steps": self.total_steps,
                      "steps_left": (self.total_steps - onset + 1) if self.total_steps else None,
                      "fraction_left": round(left_share, 4) if left_share is not None else None},
        )


class ScheduleHorizonMismatch(Rule):
    """TG102 schedule-horizon-mismatch: the LR schedule's length does not match the planned optimizer steps.

    ## What it detects
    The schedule's horizon (in scheduler steps: `OneCycleLR.total_steps`, `CosineAnnealingLR.T_max`,
    `PolynomialLR.total_iters`, a decaying `LinearLR`, or `num_training_steps` of a Hugging Face style
    `LambdaLR`, read by the probe at `trainguard.watch`) compared with the planned run: `total_steps`
    optimizer steps times the scheduler steps actually taken per optimizer step (the scheduler's
    `last_epoch` as each optimizer step begins). A horizon below 80% or above 125% of the plan is a
    mismatch. Two shapes are named: a schedule stepped once per micro-batch ends `grad_accum` times
    too early; one sized in micro-batches and stepped per optimizer step never finishes its warmup or
    its decay. When the horizon cannot be read, an LR still rising half-way through the run is named.

    ## Why it matters
    Seed 002: a scheduler sized for 75,000 micro-batches against 4,687 optimizer steps with gradient
    accumulation 16. Either direction wastes the run: LR 0 for most of it, or a warmup that never ends.

    ## Example
    `TG102 schedule-horizon-mismatch [warning] at step 1: the scheduler advances 16 steps per optimizer
    step and its horizon is 4,687 scheduler steps: it ends at optimizer step 293, 6% of the planned
    4,687 steps`

    ## What to change
    Count the schedule in optimizer steps: `num_training_steps = micro_batches // grad_accum`, and
    call `scheduler.step()` right after `optimizer.step()`, not once per micro-batch.

    ## Known false positives
    A schedule deliberately shorter than the run (a cooldown followed by a constant LR), or a run that
    will be resumed to a longer horizon; a wrong `total_steps` passed to `trainguard.watch`.

    ## Options
    None.
    """

    code, name, severity = "TG102", "schedule-horizon-mismatch", "warning"

    def __init__(self, plan: dict[str, Any]) -> None:
        super().__init__(plan)
        horizon = plan.get("sched_horizon")
        self.horizon = int(horizon) if finite(horizon) and horizon > 0 else None
        self.prev: tuple[int, float] | None = None
        self.ticks: list[float] = []  # scheduler steps per optimizer step: the first 3 decide
        self.first_step: int | None = None
        # The LR curve as the still-warming test reads it: ends, length, rises and falls between
        # neighbours. Counted as it comes, not kept: without a plan the rule never decides, and a list
        # would grow with the log.
        self.lr_first: float | None = None
        self.lr_last: float | None = None
        self.lr_count = 0
        self.rises = 0
        self.falls = 0
        self.decided = False

    def on_step(self, row: dict[str, Any]) -> Finding | None:
        step, epoch = row.get("step"), row.get("sched_epoch")
        if step is None or self.decided:
            return None
        if self.first_step is None:
            self.first_step = step
        if finite(epoch):
            if self.prev is not None and step == self.prev[0] + 1 and len(self.ticks) < 3:
                self.ticks.append(epoch - self.prev[1])
            self.prev = (step, epoch)
        lr = step_lr(row)
        if lr is not None:
            if self.lr_last is None:
                self.lr_first = lr
            elif lr > self.lr_last:
                self.rises += 1
            elif lr < self.lr_last:
                self.falls += 1
            self.lr_last = lr
            self.lr_count += 1
        if not self.total_steps:
            return None
        if self.horizon and len(self.ticks) >= 3:
            self.decided = True
            return self._by_horizon(step)
        if not self.horizon and self.fraction(step) >= 0.5 and self.lr_count >= 20:
            self.decided = True
            return self._still_warming(step)
        return None

    def _by_horizon(self, step: int) -> Finding | None:
        ticks = median(self.ticks)
        if ticks <= 0:
            return None
        planned = self.total_steps * ticks
        ratio = self.horizon / planned
        if 0.8 <= ratio <= 1.25:
            return None
        ends_at = int(self.horizon / ticks)
        ev = {"sched_horizon": self.horizon, "sched_steps_per_opt_step": ticks, "total_steps": self.total_steps,
              "grad_accum": self.grad_accum, "scheduler": self.plan.get("scheduler"), "ratio": round(ratio, 4),
              "detected_step": step}
        per = f"the scheduler advances {fmt(ticks)} step{'s' if ticks != 1 else ''} per optimizer step"
        if ratio < 0.8:
            summary = (f"{per} and its horizon is {fmt(self.horizon)} scheduler steps: it ends at optimizer "
                       f"step {fmt(ends_at)}, {ends_at / self.total_steps:.0%} of the planned "
                       f"{fmt(self.total_steps)} steps")
            ev["ends_at_step"] = ends_at
            cause = "ends-early"
            if ticks > 1 and abs(ticks - self.grad_accum) < 0.5:
                summary += f" (it is stepped once per micro-batch, grad_accum {self.grad_accum})"
        else:
            summary = (f"{per} and its horizon is {fmt(self.horizon)} scheduler steps: by the planned end "
                       f"({fmt(self.total_steps)} steps) it is only {1 / ratio:.0%} through its schedule "
                       f"(warmup and decay never finish)")
            cause = "never-finishes"
            if self.grad_accum > 1 and abs(ratio - self.grad_accum) / self.grad_accum < 0.1:
                summary += f"; it looks sized in micro-batches (grad_accum {self.grad_accum})"
        return self.finding(
            step=self.first_step, summary=summary, evidence=ev, cause=cause,
            fix="count the schedule in optimizer steps (num_training_steps = micro-batches // grad_accum) and "
                "call scheduler.step() once per optimizer step, right after optimizer.step()",
        )

    def _still_warming(self, step: int) -> Finding | None:
        # Without a readable horizon: an LR that has only ever risen, half-way through, is a warmup
        # that will not end in this run.
        rises, first, last = self.rises, self.lr_first, self.lr_last
        if self.falls > 0 or rises < 0.5 * (self.lr_count - 1):
            return None
        return self.finding(
            step=self.first_step,
            summary=f"the learning rate has only risen for {self.lr_count} steps ({fmt(first)} -> "
                    f"{fmt(last)}) and is still rising at step {step}, {self.fraction(step):.0%} of the "
                    f"planned {fmt(self.total_steps)} steps: the warmup will not finish",
            evidence={"first_lr": first, "last_lr": last, "rising_steps": rises,
                      "detected_step": step, "total_steps": self.total_steps, "grad_accum": self.grad_accum},
            cause="still-warming",
            fix="count warmup and decay in optimizer steps (divide micro-batch counts by grad_accum)",
        )
