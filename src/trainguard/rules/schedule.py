"""TG1xx: the learning-rate schedule, checked against the plan and against what the optimizer saw."""

from __future__ import annotations

from typing import Any

from trainguard.findings import LR, SCHED_HORIZON, Finding
from trainguard.rules.rule import Rule, finite, fmt, median

# An LR below this share of the run's own peak moves nothing. Not 1e-3: the classic step schedule
# (0.1 -> 0.01 -> 0.001 -> 0.0001) ends at exactly 1e-3 of its peak, on purpose.
NEGLIGIBLE = 1e-4
STREAK = 10  # consecutive optimizer steps at a negligible LR before the rule is sure
LEFT_AT_LEAST = 0.05  # a schedule that decays to zero in its last 5% is doing its job
GROSS = 2.0  # a horizon off by more than this factor is an error, not a warning
TOUCH = 0.01  # an LR at most 1% of the run's peak has reached its floor, for the cycling rule
BACK = 0.5  # ... and one back above half the peak has climbed out of it again
GRADUAL = 2  # rows of rising LR on the way back up: a warm restart jumps in one
CYCLIC = ("CosineAnnealingWarmRestarts", "CyclicLR")  # schedulers that return to their floor by design


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

    A printed LR rounded to zero (`lr:0.000000`, whose print's resolution the reader records) is no
    proof of a zero LR: a schedule that decays to 0 at its planned end prints zeros over its last
    percent or two. Without a plan such a log is judged at its end: the rounded zeros must cover more
    than 5% of the steps it shows.

    ## Known false positives
    A run that deliberately freezes learning (LR 0) for a while, e.g. to collect statistics; a
    schedule that decays more than 10,000x while it still has over 5% of the run to go.

    ## Options
    None. The thresholds (0.01% of the peak, 10 steps, 5% of the run left) are fixed.
    """

    code, name, severity = "TG101", "lr-reaches-zero", "error"
    needs = (LR,)

    def __init__(self, plan: dict[str, Any]) -> None:
        super().__init__(plan)
        self.peak = 0.0
        self.peak_step: int | None = None
        self.onset: tuple[int, float] | None = None
        self.streak = 0
        self.rounded: tuple[int, int] | None = None  # (onset, last step) of printed zeros below their resolution
        self.first_step: int | None = None
        self.said = False

    def on_step(self, row: dict[str, Any]) -> Finding | None:
        lr, step = step_lr(row), row.get("step")
        if lr is None or step is None or self.said:
            return None
        if self.first_step is None:
            self.first_step = step
        if lr > self.peak:
            self.peak, self.peak_step = lr, step
        if not self.total_steps and lr == 0 and (row.get("extra") or {}).get("lr_resolution"):
            # a print's zero, not a zero: a decay to 0 at the run's end prints the same; judged at the end
            self.rounded = (self.rounded[0] if self.rounded else step, step)
            return None
        self.rounded = None
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
        self.said = True
        return self._finding(onset, onset_lr, step, left_share)

    def end(self) -> Finding | None:
        """Printed zeros below the print's resolution at the end of a log with no plan: a schedule's own end
        unless they cover more than 5% of the steps the log shows."""
        if self.said or self.rounded is None or self.first_step is None:
            return None
        onset, last = self.rounded
        shown = last - self.first_step + 1
        if last - onset + 1 < STREAK or shown <= 0 or (last - onset + 1) / shown <= LEFT_AT_LEAST:
            return None
        self.said = True
        return self._finding(onset, 0.0, last, None, rounded=(last - onset + 1) / shown)

    def _finding(self, onset: int, onset_lr: float, step: int, left_share: float | None,
                 rounded: float | None = None) -> Finding:
        left = ""
        if self.total_steps and left_share is not None:
            left = f"; {left_share:.0%} of the planned {fmt(self.total_steps)} steps are left"
        elif rounded is not None:
            left = f" (printed as 0 at the print's resolution over the last {rounded:.0%} of the steps the log shows)"
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
    mismatch; more than 2x either way is an error (the run trains at the wrong LR for most of its
    length), between 1.25x and 2x a warning. Composite schedulers are read through: a `SequentialLR`
    ends at its last milestone plus its last scheduler's horizon, a `ChainedScheduler` where its longest
    decaying scheduler ends. Two shapes are named: a schedule stepped once per micro-batch ends `grad_accum` times
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
    None. The bands (0.8-1.25x fine, up to 2x a warning, beyond an error) are fixed.
    """

    code, name, severity = "TG102", "schedule-horizon-mismatch", "warning"
    needs = (LR, SCHED_HORIZON)

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
        if not self.horizon and (self.fraction(step) or 0.0) >= 0.5 and self.lr_count >= 20:
            self.decided = True
            return self._still_warming(step)
        return None

    def _by_horizon(self, step: int) -> Finding | None:
        ticks = median(self.ticks)
        total, horizon = self.total_steps, self.horizon
        if ticks <= 0 or not total or not horizon:  # (the caller checked the plan and the horizon)
            return None
        planned = total * ticks
        ratio = horizon / planned
        if 0.8 <= ratio <= 1.25:
            return None
        ends_at = int(horizon / ticks)
        ev = {"sched_horizon": self.horizon, "sched_steps_per_opt_step": ticks, "total_steps": self.total_steps,
              "grad_accum": self.grad_accum, "scheduler": self.plan.get("scheduler"), "ratio": round(ratio, 4),
              "detected_step": step}
        per = f"the scheduler advances {fmt(ticks)} step{'s' if ticks != 1 else ''} per optimizer step"
        if ratio < 0.8:
            summary = (f"{per} and its horizon is {fmt(self.horizon)} scheduler steps: it ends at optimizer "
                       f"step {fmt(ends_at)}, {ends_at / total:.0%} of the planned "
                       f"{fmt(self.total_steps)} steps")
            ev["ends_at_step"] = ends_at
            cause = "ends-early"
            if ticks > 1 and abs(ticks - self.grad_accum) < 0.5:
                summary += f" (it is stepped once per micro-batch, grad_accum {self.grad_accum})"
        else:
            warmup = self.plan.get("sched_warmup")
            if finite(warmup) and warmup > 0 and warmup > planned:
                cut = f"its warmup ({fmt(warmup)} scheduler steps) and its decay never finish"
            elif finite(warmup) and warmup > 0:
                cut = (f"its warmup ends at scheduler step {fmt(warmup)}, but its decay never finishes: the LR "
                       f"is never annealed")
            else:
                cut = "its decay never finishes: the LR is never annealed"
            ev["sched_warmup"] = warmup
            summary = (f"{per} and its horizon is {fmt(self.horizon)} scheduler steps: by the planned end "
                       f"({fmt(self.total_steps)} steps) it is only {1 / ratio:.0%} through its schedule "
                       f"({cut})")
            cause = "never-finishes"
            if self.grad_accum > 1 and abs(ratio - self.grad_accum) / self.grad_accum < 0.1:
                summary += f"; it looks sized in micro-batches (grad_accum {self.grad_accum})"
        # Off by more than 2x either way, the run trains at a wrong LR for most of its length (zero, or
        # never annealed): an error. Between 1.25x and 2x it is a warning.
        gross = ratio < 1 / GROSS or ratio > GROSS
        return self.finding(
            step=self.first_step, summary=summary, evidence=ev, cause=cause,
            severity="error" if gross else "warning",
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


class LrCyclesToZero(Rule):
    """TG103 lr-cycles-to-zero: the learning rate falls to zero, climbs back up and falls to zero again.

    ## What it detects
    The LR (the largest over the param groups) falls to its floor (at most 1% of the run's peak),
    climbs back gradually (over two or more rising rows) above half the peak, and falls to the floor
    again. Schedulers that cycle on purpose (`CosineAnnealingWarmRestarts`, `CyclicLR`, also inside a
    `SequentialLR` or `ChainedScheduler`) are left alone; a warm restart that jumps back up in one step
    is not a gradual climb and does not count.

    ## Why it matters
    `CosineAnnealingLR` is periodic: stepped past its `T_max` it climbs back to the peak over another
    `T_max` steps and decays again. A `T_max` sized for an epoch, or in optimizer steps of a shorter
    plan, sends the LR to zero again and again: every trip to zero wastes steps, every climb re-heats the
    weights, and the run ends wherever in the cycle it happens to be. No single step looks wrong, so
    `lr-reaches-zero` (ten steps in a row at zero) never sees it.

    ## Example
    `TG103 lr-cycles-to-zero [error] at step 37: the learning rate fell to 0 at step 37, climbed back to
    100% of its peak (1.00e-03) by step 74 and fell to 0 again at step 112: the schedule is periodic,
    not a decay (CosineAnnealingLR, horizon 37 scheduler steps, 300 planned steps)`

    ## What to change
    Size the cosine for the whole run in optimizer steps (`T_max = total_steps - warmup`), or use
    `CosineAnnealingWarmRestarts` if restarts are what you want.

    ## Known false positives
    A cyclical schedule written by hand (or read from a log without the scheduler's name): then the
    finding is a warning, not an error.

    ## Options
    None: the floor (1% of the peak) and the climb (back above half the peak) are fixed.
    """

    code, name, severity = "TG103", "lr-cycles-to-zero", "error"
    needs = (LR,)
    status = "preview"

    def __init__(self, plan: dict[str, Any]) -> None:
        super().__init__(plan)
        names = [n for n in (plan.get("schedulers") or [plan.get("scheduler")]) if n]
        self.cyclic = any(n in CYCLIC for n in names)
        self.known = bool(names)  # the scheduler's type is known and it is not a cyclic one
        self.peak = 0.0
        self.prev: float | None = None
        self.first_zero: tuple[int, float] | None = None  # (step, lr) where the LR first hit the floor
        self.climbed: tuple[int, float] | None = None  # (step, lr) back above half the peak, gradually
        self.rising = 0  # rising rows since the floor
        self.at_floor = False
        self.done = False

    def on_step(self, row: dict[str, Any]) -> Finding | None:
        if self.done or self.cyclic:
            return None
        lr, step = step_lr(row), row.get("step")
        if lr is None or step is None:
            return None
        prev, self.prev = self.prev, lr
        self.peak = max(self.peak, lr)
        if self.peak <= 0:
            return None
        if lr <= TOUCH * self.peak:
            if not self.at_floor:
                self.at_floor, self.rising = True, 0
                if self.first_zero is None:
                    self.first_zero = (step, lr)
                elif self.climbed is not None:
                    self.done = True
                    return self._found(step, lr, self.first_zero, self.climbed)
            return None
        self.at_floor = False
        if self.first_zero is not None and self.climbed is None:
            if prev is not None and lr > prev:
                self.rising += 1
            if lr >= BACK * self.peak:
                if self.rising >= GRADUAL:
                    self.climbed = (step, lr)
                else:  # back up in a jump: a warm restart, by design
                    self.first_zero = None
        return None

    def _found(self, step: int, lr: float, first_zero: tuple[int, float], climbed: tuple[int, float]) -> Finding:
        (z0, lr0), (up, lr_up) = first_zero, climbed
        horizon = self.plan.get("sched_horizon")
        sched = self.plan.get("scheduler")
        context = ", ".join(x for x in (
            str(sched) if sched else "",
            f"horizon {fmt(horizon)} scheduler steps" if finite(horizon) else "",
            f"{fmt(self.total_steps)} planned steps" if self.total_steps else "") if x)
        return self.finding(
            step=z0, severity="error" if self.known else "warning",
            summary=(f"the learning rate fell to {fmt(lr0)} at step {z0}, climbed back to {lr_up / self.peak:.0%} of"
                     f" its peak ({fmt(self.peak)}) by step {up} and fell to {fmt(lr)} again at step {step}: the"
                     f" schedule is periodic, not a decay" + (f" ({context})" if context else "")),
            fix="size the cosine for the whole run in optimizer steps (T_max = total_steps - warmup); use "
                "CosineAnnealingWarmRestarts if restarts are what you want",
            evidence={"first_zero_step": z0, "first_zero_lr": lr0, "climbed_back_step": up, "climbed_back_lr": lr_up,
                      "zero_again_step": step, "peak_lr": self.peak, "scheduler": sched,
                      "sched_horizon": horizon, "total_steps": self.total_steps, "detected_step": step},
        )


class LrRestartsAtResume(Rule):
    """TG105 lr-restarts-at-resume: after a resume the LR does not continue where the schedule had it.

    ## What it detects
    A resume: `guard.set_step(n)`, a restart by `trainguard run --on-hang restart` (a new attempt of the
    probe), or steps that start again below the last one. The LR of the first steps after it is compared
    with what the run had planned there: the LR the earlier attempt had at the very same step when it
    got that far (the last 512 steps are remembered; the first 50 steps after the resume are judged),
    else, for the first step, the last LR before the resume. Off by 5x or more at three steps in a
    row: the schedule started over (its warm-up again, its peak after a decay, or a chained warm-up
    multiplying an LR already restored) instead of continuing.

    Where the log's format says its schedule only decays after the warm-up (Ultralytics and YOLOv5:
    lr0 x lf(epoch), lf falling from 1 to lrf), no resume needs to be seen: an LR 1.5x or more above the
    row before, after at least three rows of decay, is the schedule started over (cause
    `jump-after-decay`), the usual trace of a run resumed into the same folder with a rebuilt optimizer.
    A restart at a fraction f of a linear decay to lrf jumps by 1/(1 - f): 1.5x from a third of the way
    on; such a schedule never rises by rounding (the writers print 5 significant digits).

    ## Why it matters
    A checkpoint that holds the model and the optimizer but not the scheduler resumes with a fresh
    schedule: a run at its peak LR drops back to the first warm-up step (or a decayed run jumps back to
    its peak) and trains the rest of the run on the wrong schedule, silently (huggingface/transformers
    #7198-style reports: the scheduler state not restored on resume).

    ## Example
    `TG105 lr-restarts-at-resume [warning] at step 106: after the resume (attempt 1) the LR at step 106
    is 0.00595 where the run had 9.98e-04 at this step before (6x higher), 0.00793 against 9.97e-04 at
    step 108: the schedule started over instead of continuing from the checkpoint (resumed at step 101)`

    ## What to change
    Save `scheduler.state_dict()` in the checkpoint and `scheduler.load_state_dict(...)` it on resume
    (or build the scheduler with `last_epoch` set to the checkpoint's step).

    ## Known false positives
    A resume that changes the LR on purpose (fine-tuning from a checkpoint with a new schedule).

    ## Options
    None.
    """

    code, name, severity = "TG105", "lr-restarts-at-resume", "warning"
    needs = (LR,)
    OFF = 5.0  # times the planned LR, either way
    RISE = 1.5  # times the row before, in a schedule that never rises after its warm-up
    REMEMBER = 512
    WINDOW = 50  # steps after the resume judged against the plan

    def __init__(self, plan: dict[str, Any]) -> None:
        super().__init__(plan)
        self.decays_only = bool(plan.get("lr_decays_only"))  # the format's schedule never rises after warm-up
        self.decaying = 0  # rows in a row whose LR did not rise (the run is past its warm-up)
        self.lr_at: dict[int, float] = {}  # step -> LR, the last REMEMBER steps
        self.last: tuple[int, float] | None = None
        self.resume: dict[str, Any] | None = None  # the resume being judged: where, how, what was planned
        self.after: list[tuple[int, float, float]] = []  # (step, LR, planned) of the steps after it
        self.done = False

    def on_event(self, event: dict[str, Any]) -> None:
        kind, name, data = event.get("kind"), event.get("name"), event.get("data") or {}
        if kind == "probe" and name == "set_step":
            self._resumed("set_step", event.get("step"), event.get("attempt"))
        elif kind == "probe" and name == "start" and isinstance(data.get("attempt"), int) and data["attempt"] > 0:
            self._resumed("a new attempt", None, data["attempt"])
        elif kind == "run" and name == "restart":
            self._resumed("a restart", None, data.get("attempt"))

    def _resumed(self, how: str, step: Any, attempt: Any) -> None:
        if self.done or self.last is None:
            return  # nothing ran before it: a start, not a resume
        if self.resume is None or self.after:
            self.resume, self.after = {"how": how, "attempt": attempt, "last": self.last}, []
        if isinstance(attempt, int) and attempt > 0:
            self.resume["attempt"] = attempt

    def on_step(self, row: dict[str, Any]) -> Finding | None:
        lr, step = step_lr(row), row.get("step")
        if self.done or not finite(lr) or not isinstance(step, int):
            return None
        if self.last is not None and step <= self.last[0] and self.resume is None:
            self._resumed("steps starting again", step, row.get("attempt"))
        found = self._judge(step, lr) if self.resume is not None else None
        if found is None and self.decays_only and self.resume is None:
            found = self._jump(step, lr)
        if self.resume is None:
            self.lr_at[step] = lr
            if len(self.lr_at) > self.REMEMBER:
                del self.lr_at[next(iter(self.lr_at))]
        self.last = (step, lr)
        return found

    def _jump(self, step: int, lr: float) -> Finding | None:
        """In a schedule that only decays after its warm-up: an LR 1.5x above the row before, after decay."""
        if self.last is None:
            return None
        prev_step, prev = self.last
        if lr <= prev * (1 + 1e-6):
            self.decaying += 1
            return None
        decayed, self.decaying = self.decaying, 0
        if decayed < 3 or prev <= 0 or lr < self.RISE * prev:
            return None
        self.done = True
        peak = max(self.lr_at.values(), default=lr)
        back = " (back at the run's peak)" if lr >= 0.5 * peak else ""
        return self.finding(
            step=step, cause="jump-after-decay",
            summary=f"the LR jumped from {fmt(prev)} at step {prev_step} to {fmt(lr)} at step {step} ({lr / prev:.1f}x)"
                    f"{back} after {decayed} steps of decay, in a schedule that only decays after its warm-up: it "
                    "started over instead of continuing (a resume with a rebuilt optimizer or scheduler)",
            fix="resume with the framework's own resume (YOLO: `resume=True` / `--resume` on the last.pt of the "
                "same run), which restores the optimizer and the epoch; to train longer, start a new run from the "
                "weights with its own schedule; in your own loop, save and load scheduler.state_dict()",
            evidence={"before": {"step": prev_step, "lr": prev}, "after": {"step": step, "lr": lr},
                      "ratio": lr / prev, "decay_steps": decayed, "peak": peak, "detected_step": step},
        )

    def _judge(self, step: int, lr: float) -> Finding | None:
        """One step after the resume: its LR against the plan's. The plan is the LR the earlier attempt had at
        this very step; where it never got there, the last LR before the resume (for the first step only)."""
        assert self.resume is not None
        planned = self.lr_at.get(step)
        if planned is None and not self.after:
            planned = self.resume["last"][1]
        if planned is None:
            self.resume, self.after = None, []
            return None  # past what the earlier attempt reached: nothing planned to compare with
        self.after.append((step, lr, planned))

        def off(a: float, b: float) -> float:
            if b <= 0:
                return 1.0
            return float("inf") if a <= 0 else max(a / b, b / a)

        streak, i = 0, -1
        while streak < 3 and i + 1 < len(self.after):
            i += 1
            _, x, p = self.after[i]
            streak = streak + 1 if off(x, p) >= self.OFF else 0
        if streak < 3:
            if len(self.after) >= self.WINDOW:
                self.resume, self.after = None, []  # the schedule continued
            return None
        first = i - 2
        (s0, lr0, p0), (s2, lr2, p2) = self.after[first], self.after[i]
        resume, self.resume = self.resume, None
        self.done = True
        ratio = off(lr0, p0)
        where = "at this step before" if s0 in self.lr_at else f"at step {resume['last'][0]}, before the resume"
        self.after = self.after[: i + 1]
        way = "lower" if lr0 < p0 else "higher"
        attempt = f" (attempt {resume['attempt']})" if isinstance(resume.get("attempt"), int) else ""
        return self.finding(
            step=s0, cause="schedule-restarted",
            summary=f"after the resume{attempt} the LR at step {s0} is {fmt(lr0)} where the run had {fmt(p0)} {where} "
                    f"({ratio:.0f}x {way}), {fmt(lr2)} against {fmt(p2)} at step {s2}: the schedule started over "
                    f"instead of continuing from the checkpoint (resumed at step {self.after[0][0]})",
            fix="save scheduler.state_dict() in the checkpoint and load it on resume (or build the scheduler with "
                "last_epoch set to the checkpoint's step)",
            evidence={"steps": [s for s, _, _ in self.after], "lrs": [x for _, x, _ in self.after],
                      "planned": [p for _, _, p in self.after], "ratio": ratio, "resumed_by": resume["how"],
                      "attempt": resume.get("attempt"), "detected_step": s2},
        )
