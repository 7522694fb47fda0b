"""TG204: a loss that does not fall, over the run's own noise (and a short run pinned at chance)."""

from __future__ import annotations

import math
from typing import Any

from trainguard.findings import LOSS, Finding
from trainguard.rules.rule import Rule, finite, fmt, median, robust_std

CHANCE_ROWS = 4  # values of a short run's loss, all at ln(K)
CHANCE_CLASSES = 10
CHANCE_BAND = 0.015  # relative: ln 2 +- 0.010, ln 6 +- 0.027


class LossNotDecreasing(Rule):
    """TG204 loss-not-decreasing: no improvement beyond the loss's own noise over a window of the run.

    ## What it detects
    After a window of 5% of the planned run (at least 50, at most 200 steps; 200 without a plan),
    counted in optimizer steps, not in logged rows (a log that reports every 50th step reaches it in a
    few rows; at least 16 rows are needed; without a plan, rows), the median loss of the first half of the rows so far is
    compared with the median of the latest half.
    The loss must have fallen by more than twice the standard error of that comparison (from the
    loss's own step-to-step noise) and by at least 1% of its starting level, or the rule fires. When
    the loss is so noisy that a fall of 5% could not be told from noise yet, the rule waits for more
    steps (up to a quarter of the run) before it decides; if it is still that noisy then, it fires
    only when the loss did not go down at all. It decides once.

    When the loop reports the weights of its loss parts and they changed over the rows compared (a
    curriculum: a distillation weight ramping up), the weighted total moves by design, so the same test
    is made on the total at fixed weights (each row's parts at the latest weights).

    ## Why it matters
    A run that does not learn in its first few percent rarely learns later: the data do not match the
    labels, the loss is computed on the wrong tensors, gradients do not reach the model, or the LR is
    far too small. Every step after that is wasted.

    ## Example
    `TG204 loss-not-decreasing [warning] at step 1: after 50 steps the loss is 2.31 (median of the
    last 25), against 2.30 over its first 25 steps; its step-to-step noise is 0.041`

    ## What to change
    Look at a batch: do inputs and targets line up? Is the LR sensible for the optimizer? Do the
    other rules name a cause (`lr-reaches-zero`, `weights-not-updating`)?

    A log that begins well into its run (a resumed run's log whose first loss is past 10% of its plan, or,
    without a plan, past step 1000 and 20 logging intervals) is not judged: the part where a run that
    learns shows it is not in the log.

    A source whose loss rows are epochs (`step_unit: epoch` in the plan its reader states) is judged
    once, when it ends, over all its epochs (at least 16): its first half against its second.

    A fall of more than one standard error but less than two is undecided, not flat: the rule waits for
    more steps (up to 3/4 of a planned run). A run too short for the comparison (4 to 15 rows) is judged
    at its end on one thing: whether its training or evaluation loss stayed within 1.5% of ln(K), K up
    to 10, at every value, the loss of a uniform guess over K classes (cause `at-chance`).

    ## Known false positives
    Fine-tuning a model that already solves the task (the loss starts at its floor); a warmup longer
    than the window that keeps the LR near zero.

    ## Options
    Not judged for a job watched with `trainguard.watch(..., learning=False)` (a model run without
    training: an evaluation, a teacher writing its cache).
    """

    code, name, severity = "TG204", "loss-not-decreasing", "warning"
    needs = (LOSS,)
    MAX_KEEP = 2000
    MIN_ROWS = 16  # 8 a half: fewer cannot give a median and a noise

    def __init__(self, plan: dict[str, Any]) -> None:
        super().__init__(plan)
        self.w = self.window(0.05, 50, 200)
        self.patience = max(self.w, int(0.25 * self.total_steps)) if self.total_steps else 1000
        # a source whose loss rows are epochs (a results.csv, a Keras CSVLogger, an on-epoch-only Lightning
        # loss): 200 rows would be 200 epochs, and the first epochs of a fine-tune say little: judged once,
        # over all its epochs, when the stream ends
        self.epochs = plan.get("step_unit") == "epoch"
        self.last_step: int | None = None
        self.losses: list[float] = []
        self.parts: list[dict[str, Any] | None] = []  # each row's parts, beside its loss
        self.first_weights: dict[str, float] = {}
        self.weights: dict[str, float] = {}  # the latest reported weights
        self.weighted = False  # the reported weights changed: the total is judged at fixed weights
        self.first_step: int | None = None
        self.second_step: int | None = None  # with the first, the log's interval: a late start is beyond it
        self.n = 0
        self.next_check = self.w
        self.decided = False
        # an undecided fall (see `_judge`) waits up to 3/4 of a planned run, at most twice the patience
        self.long_patience = (max(self.patience, min(3 * self.total_steps // 4, 2 * self.patience))
                              if self.total_steps else self.patience)
        self.undecided = False  # a fall of 1-2 standard errors waited for more steps
        self.eval_losses: list[tuple[Any, float]] = []  # (step, loss) of the first evaluations, for `_at_chance`
        self.first_losses: list[tuple[Any, float]] = []

    def on_event(self, event: dict[str, Any]) -> None:
        if event.get("kind") != "eval" or len(self.eval_losses) >= self.MIN_ROWS:
            return
        value = (event.get("data") or {}).get("loss")
        if finite(value):
            self.eval_losses.append((event.get("step"), float(value)))

    def on_step(self, row: dict[str, Any]) -> Finding | None:
        loss = row.get("loss")
        if self.decided or not finite(loss) or not self.learning:
            return None
        if len(self.first_losses) < self.MIN_ROWS:
            self.first_losses.append((row["step"], float(loss)))
        self.n += 1
        if self.first_step is None:
            self.first_step = row["step"]
        elif self.second_step is None:
            self.second_step = row["step"]
        for name, w in (row.get("weights") or {}).items():
            if finite(w):
                self.weights[name] = w
                if abs(self.first_weights.setdefault(name, w) - w) > 1e-9 * max(1.0, abs(w)):
                    self.weighted = True
        self.losses.append(loss)
        self.parts.append(row.get("parts") or None)
        if len(self.losses) > self.MAX_KEEP:
            del self.losses[self.MAX_KEEP // 2 : self.MAX_KEEP // 2 + 1]  # keep the start, thin the middle
            del self.parts[self.MAX_KEEP // 2 : self.MAX_KEEP // 2 + 1]
        self.last_step = row["step"]
        if self.epochs:
            return None
        # steps covered, whatever the logging interval; without a plan the window has no length to be a
        # share of, and a row stands for a step (the 200-step window and 1000-step patience are rows)
        span = row["step"] - self.first_step + 1 if self.total_steps else self.n
        if span < self.next_check or self.n < self.MIN_ROWS:
            return None
        self.next_check = span + max(5, len(self.losses) // 8) * max(1, span // self.n)  # a quarter of a half again
        return self._judge(row["step"], span < self.patience, span < self.long_patience)

    def end(self) -> Finding | None:
        if self.epochs and not self.decided and self.n >= self.MIN_ROWS and self.last_step is not None:
            return self._judge(self.last_step, False)
        if not self.decided and self.n < self.MIN_ROWS and self.learning:
            return self._at_chance()
        if self.undecided and not self.decided and self.last_step is not None:
            return self._judge(self.last_step, False)
        return None

    def _at_chance(self) -> Finding | None:
        """A run too short for the halves' comparison (fewer than 16 rows: 4 epochs of a BERT fine-tune, 13
        of an EEG classifier) whose training or evaluation loss never left ln(K), the loss of a uniform guess
        over K classes, K up to 10: it ended where an untrained model starts. Above K = 10 the ln(K) lie
        closer together than the band, and any loss would sit near one of them."""
        for what, series in (("training loss", self.first_losses), ("evaluation loss", self.eval_losses)):
            if len(series) < CHANCE_ROWS:
                continue
            values = [v for _, v in series]
            k = round(math.exp(median(values)))
            if not 2 <= k <= CHANCE_CLASSES or any(abs(v - math.log(k)) > CHANCE_BAND * math.log(k) for v in values):
                continue
            return self.finding(
                step=series[0][0], cause="at-chance",
                summary=f"the {what} stayed within {CHANCE_BAND:.1%} of ln({k}) = {math.log(k):.4f}, the loss of a "
                        f"uniform guess over {k} classes, at all {len(values)} of its values (steps {series[0][0]}-"
                        f"{series[-1][0]}: {fmt(values[0])} -> {fmt(values[-1])}): the model never got past chance",
                fix="check that the labels reach the loss and match the inputs (shuffled separately? one class?), "
                    "that the LR is not far too small or too large, and that the output head is trained",
                evidence={"what": what, "classes": k, "chance_loss": math.log(k), "values": values,
                          "steps": [s for s, _ in series], "detected_step": series[-1][0]},
            )
        return None

    def begins_late(self) -> bool:
        """Whether the loss seen starts well into its run (a resumed run's log, a log kept from its middle):
        the early part, where a run that learns shows it, is not in it, and a loss that no longer falls much
        later in a plan is no sign of a run that does not learn. With a plan: the first loss is past 10% of
        it (beyond one logging interval). Without: past the rule's own patience (1000 steps) and past 20
        logging intervals (a run that logs every 1000th step starts at step 1000, not late). A reader that
        counts the log's steps from its own first epoch states where in the plan that is (`starts_at`)."""
        if (self.plan.get("starts_at") or 0) >= 0.1:  # the reader knows where in its plan the log begins
            return True
        if self.first_step is None:
            return False
        gap = max(1, (self.second_step - self.first_step) if self.second_step is not None else 1)
        if self.total_steps:
            return self.first_step - gap >= 0.1 * self.total_steps
        return self.first_step >= max(self.patience, 20 * gap)

    def _judge(self, step: int, can_wait: bool, can_wait_longer: bool = False) -> Finding | None:
        if self.begins_late():
            self.decided = True
            return None
        k = len(self.losses) // 2
        series, judged = self._series()
        first, recent = series[:k], series[-k:]
        start, now = median(first), median(recent)
        noise = robust_std(recent)
        se = 1.25 * noise * math.sqrt(2.0 / k)
        if se > 0.025 * abs(start) and can_wait:
            return None  # too noisy to tell a 5% fall from chance yet: wait for more steps
        need = max(2 * se, 0.01 * abs(start))
        if se < start - now <= need and can_wait_longer:
            # It fell by more than its standard error but less than twice: undecided, not flat (a 100-step
            # DeepSpeed run fell 4.88 -> 4.80 under noise 0.13 by step 50, 0.12 by step 70). More steps tell;
            # a loss that did not fall at all is still said at the first look; a stream that ends first is
            # decided at its end (a flat 7.6 over 220 rows that drifts down by 1-2 standard errors).
            self.undecided = True
            return None
        self.decided = True
        if start - now > need:
            return None
        if se > 0.025 * abs(start) and start - now > 0:
            # Still too noisy to tell a 5% fall from chance at the end of its patience, and the loss did go
            # down: not enough to say it is not learning (a 60-step DDP regression fell 4.5% under noise
            # of 29% while its eval loss fell 28%). A loss that did not go down at all is still said.
            return None
        return self.finding(
            step=self.first_step,
            summary=f"after {self.n} logged steps (to step {step}) {judged} is {fmt(now)} (median of the last "
                    f"{k}), against {fmt(start)} over its first {k}; its step-to-step noise is {fmt(noise)}",
            fix="check that inputs and targets line up, the LR suits the optimizer, and gradients reach the model",
            evidence={"start_median": start, "recent_median": now, "noise": noise, "needed_drop": need,
                      "window": k, "detected_step": step,
                      "fixed_weights": dict(self.weights) if judged != "the loss" else None},
        )

    def _series(self) -> tuple[list[float], str]:
        """The losses to compare, and what they are: the reported total, or, when the reported weights of
        its parts changed (a curriculum), every row's parts at the latest weights, where each row has them."""
        if not self.weighted:
            return self.losses, "the loss"
        fixed: list[float] = []
        for parts in self.parts:
            total = 0.0
            for name, w in self.weights.items():
                value = (parts or {}).get(name)
                if not finite(value):
                    break
                total += w * value
            else:
                fixed.append(total)
        if len(fixed) < len(self.losses):  # a row without every weighted part: the total it is
            return self.losses, "the loss"
        return fixed, "the loss at fixed weights (" + ", ".join(f"{n} x {fmt(w)}" for n, w in self.weights.items()) + ")"
