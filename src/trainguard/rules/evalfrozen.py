"""TG203: evaluations that stop moving while the run trains, or that never leave the floor."""

from __future__ import annotations

import collections
import math
import re
from typing import Any

from trainguard.findings import EVAL, Finding
from trainguard.rules.rule import Rule, Streak, finite, fmt, median
from trainguard.rules.schedule import step_lr


def _model_metric(name: Any) -> bool:
    """A metric of the model, not of the evaluation's cost (its runtime, data time, memory)."""
    low = str(name).lower()
    return low not in ("data", "eta") and not any(w in low for w in _NOT_MODEL)


def _eval_key(data: dict[str, Any]) -> tuple | None:
    # NaN and inf are `nonfinite-loss`'s to report: a NaN repeated is not a frozen result
    numeric = {k: v for k, v in data.items()
               if isinstance(v, (int, float)) and not isinstance(v, bool) and finite(v) and _model_metric(k)}
    if not numeric:
        return None
    # A metric pinned at a bound (accuracy 1.0 or 100 %, error 0.0) is not frozen, it is finished.
    if all(_at_bound(k, v) for k, v in numeric.items()):
        return None
    return tuple(sorted((k, float(f"{v:.7g}")) for k, v in numeric.items()))


def _at_bound(name: Any, value: float) -> bool:
    """A value a metric cannot pass: 0 (an error, a loss), a ratio's ceiling, 1 or 100 (%). A loss-like
    metric has no ceiling at 100: a loss of 100.0 three times over is a number that did not move."""
    if value in (0.0, 1.0):
        return True
    low = str(name).lower()
    return value == 100.0 and not any(w in low for w in _CONTINUOUS)


# Loss-like evaluation metrics: averages over many samples, which move whenever the weights move.
_CONTINUOUS = ("loss", "ppl", "perplexity", "nll")
# Metrics about the evaluation's cost, not the model: they change on their own.
_NOT_MODEL = ("runtime", "per_second", "samples", "steps", "epoch", "time", "flos", "mem", "best", "fps", "wps")
FROZEN_SPREAD = 1e-5  # relative: a loss equal to 5 significant digits
# Higher-is-better scores: 0 is the floor a learning model leaves (precision(B), mAP50-95, val_acc, mean_dice)
_SCORE = re.compile(r"map|precision|recall|acc|f1|dice|iou|auc|bleu|rouge|top-?[15]")
_NOT_SCORE = ("loss", "err", "wer", "cer", "ppl", "perplexity", "fpr", "eer", "best", "std")
PINNED_SCORE = 0.01  # a score at or below this (of 1, or of 100 %) is at its floor
FROZEN_EVALS = 5  # evaluations in a row, for one metric while others move
FROZEN_DIGITS = 5  # one loss-like metric frozen: equal to 5 significant digits, which its print must carry
PLATEAU_DIGITS = 4  # results printed to at most 4 significant digits repeat on a plateau: ten in a row
SETTLED = 0.01  # a training loss within 1% of its value when the streak began: the run has converged
LEARNED = 0.1  # ... after it had fallen (or risen) more than 10% from its first value: it learned, then settled
# a run from scratch often scores 0 through its first epochs (a detector's warm-up: no box passes the
# confidence threshold yet); ten evaluations at the floor are no warm-up any more
SCORES_AT_ZERO_EVALS = 10


def _score(name: Any) -> bool:
    low = str(name).lower()
    return _SCORE.search(low) is not None and not any(w in low for w in _NOT_SCORE) and _model_metric(name)


def _digits(value: float) -> int:
    """The significant digits a value was printed with, as far as its float shows (0.0017: 2, 0.2714: 4;
    a float computed, not printed, shows 7 or more)."""
    mant = f"{abs(value):.7e}".split("e")[0].replace(".", "").rstrip("0")
    return max(1, len(mant))


def _uniform_classes(value: float) -> int | None:
    """K when `value` is ln(K) to 5 digits (2 <= K <= 1,000,000): the loss of a uniform guess over K classes."""
    if not 0.69 < value < 13.9:
        return None
    k = round(math.exp(value))
    return k if abs(math.log(k) - value) <= 1e-5 * value else None


class EvalMetricsFrozen(Rule):
    """TG203 eval-metrics-frozen: evaluation results that do not change from one evaluation to the next.

    ## What it detects
    Either three evaluations in a row whose numeric results are all identical (to 7 significant
    digits; five in a row when every result is printed to 3 significant digits or fewer, as a rounded
    `accuracy: 0.551` repeats by chance; results all at a bound, an accuracy at 1.0 or 100 %, an error at
    0, do not count: a metric at its ceiling or floor is finished, not frozen); or one loss-like
    metric (`loss`, `ppl`, `nll`) equal to 5 significant digits at five evaluations in a row while
    the other metrics move, judged per metric. A frozen loss at ln(K) is named as the loss of a
    uniform guess over K classes. NaN and inf are left to `nonfinite-loss`.

    While the training goes on between the repeats (its loss changed, its LR is not 0), three identical
    evaluations are not enough: the streak must reach five (ten when every result is printed to at most
    four significant digits, like `Val Loss=0.0005` or `Validation L1: 0.2714`: a model still improving,
    or on a validation plateau, prints the same rounded numbers for several evaluations). Results printed
    to at most four digits on a converged run are not frozen at all: a training loss that fell more than
    10% from its first value and has stayed within 1% (or its own print's step) since the streak began,
    with an LR that is not 0, says the weights settled by design. The per-metric check needs a loss
    printed to five significant digits or more: `0.0019` five times over shows no equality to five. Five, too, while the LR is in its schedule's tail (at most 1% of its
    peak, or printed as 0 below the print's resolution): a decay to 0 at the planned end holds the
    weights nearly still by design. And at the end of the run: every higher-is-better score of the
    evaluations (mAP, precision, recall, accuracy, F1, Dice, IoU) at or below 0.01 over at least the last
    half of them (five or more) while the training ran: a model that gets nothing right.

    ## Why it matters
    Between two evaluations the weights changed, so the results should too. Identical results mean
    the weights did not change (seed 002: `101.40 -> 101.40 -> 101.40` with the LR at zero), or the
    evaluation does not look at the model being trained (a stale copy, a cached result). An eval loss
    pinned at ln(4) while the accuracy jitters around 25% is a 4-way classifier that outputs the same
    distribution for every input: it never learned.

    ## Example
    `TG203 eval-metrics-frozen [error] at step 400: eval loss 1.38629 at 5 evaluations in a row (steps
    400-600, spread 1.2e-06) while accuracy moved (0.234-0.301): it is ln(4), the loss of a uniform
    guess over 4 classes`

    ## What to change
    Check that the weights move (`weights-not-updating`, `lr-reaches-zero`) and that the evaluation
    runs the model being trained, not a copy made before training; a loss at ln(K): check the labels
    reach the loss and the head is not saturated or detached.

    ## Known false positives
    An evaluation that reports a rounded or integer metric that truly did not change; a loss measured
    after the LR schedule has decayed to nothing (not judged per metric once the LR is below 5% of
    its peak). Not one: a framework that copies its last evaluation forward over epochs it does not
    evaluate (Ultralytics, runs of 2-3 identical rows while the training loss moves), or an accuracy
    over a fixed set repeating near convergence: both stay below five in a row.

    ## Options
    None.
    """

    code, name, severity = "TG203", "eval-metrics-frozen", "error"
    needs = (EVAL,)

    def __init__(self, plan: dict[str, Any]) -> None:
        super().__init__(plan)
        self.key: tuple | None = None
        self.same = Streak()  # the steps of the evaluations in a row with these results
        # per loss-like metric: the recent (step, value) of evaluations in a row, and the other metrics' ranges
        self.runs: dict[str, collections.deque[tuple[Any, float]]] = {}
        self.others: dict[str, collections.deque[float]] = {}
        self.lr_peak = 0.0
        self.lr: float | None = None
        # the LR is in its schedule's tail (at most 1% of its peak, or a print's zero below its resolution):
        # a decay to 0 at the run's planned end holds the weights nearly still by design
        self.lr_tail = False
        self.loss: float | None = None  # the latest training loss
        self.loss_at_eval: float | None = None  # the training loss at the previous evaluation
        self.trained = False  # the training moved at some point between the evaluations of the streak
        self.loss_at_start: float | None = None  # the training loss when the streak of identical results began
        self.first_loss: float | None = None
        # higher-is-better scores (mAP, accuracy, F1, Dice), for `_pinned_at_zero`: how many evaluations
        # carried each, and the latest evaluations in a row with every score at the floor
        self.score_counts: dict[str, int] = {}
        self.low = Streak()
        self.low_max: dict[str, float] = {}
        self.n_evals = 0
        self.last_eval_step: Any = None

    def on_step(self, row: dict[str, Any]) -> None:
        lr = step_lr(row)
        if finite(lr):
            self.lr = lr
            self.lr_peak = max(self.lr_peak, lr)
            rounded = lr == 0 and bool((row.get("extra") or {}).get("lr_resolution"))
            self.lr_tail = rounded or 0 < lr <= 0.01 * self.lr_peak
        if finite(row.get("loss")):
            self.loss = row["loss"]
            if self.first_loss is None:
                self.first_loss = self.loss

    def on_event(self, event: dict[str, Any]) -> Finding | None:
        if event.get("kind") != "eval":
            return None
        data = event.get("data") or {}
        self.n_evals += 1
        self.last_eval_step = event.get("step")
        scores = {k: float(v) for k, v in data.items() if _score(k) and finite(v)}
        for name in scores:
            self.score_counts[name] = self.score_counts.get(name, 0) + 1
        if scores and all(v <= PINNED_SCORE for v in scores.values()):
            if not self.low.count:
                self.low_max = {}
            self.low.add(event.get("step"))
            for name, v in scores.items():
                self.low_max[name] = max(self.low_max.get(name, 0.0), v)
        else:
            self.low.clear()
        return self._all_same(event, data) or self._one_frozen(event, data)

    def end(self) -> Finding | None:
        return self._pinned_at_zero()

    def _pinned_at_zero(self) -> Finding | None:
        """Every higher-is-better score of the evaluations at (or within 0.01 of) 0 over the run's last half
        (at least 10 evaluations) while training went on: a model that gets nothing right. `_at_bound` takes 0
        as a finished error; for a score 0 is the floor it should have left: YOLO runs whose P, R and mAP
        are 0 in all 50 rows, a segmentation run whose mean Dice never passes 0.003 in 100 epochs."""
        if not self.score_counts or self.n_evals < SCORES_AT_ZERO_EVALS or \
                any(n != self.n_evals for n in self.score_counts.values()):
            return None  # a score missing from some evaluations: not the same evaluation each time
        tail = self.low.count  # the evaluations at the floor, counted back from the last
        if tail < max(SCORES_AT_ZERO_EVALS, self.n_evals // 2):
            return None
        steps = self.low.steps
        since = "at every evaluation" if tail == self.n_evals else f"over the last {tail} of its {self.n_evals} evaluations"
        tops = ", ".join(f"{n} {'at' if top == 0 else 'at most'} {fmt(top)}" for n, top in list(self.low_max.items())[:4])
        loss = (f" while the training loss went {fmt(self.first_loss)} -> {fmt(self.loss)}"
                if self.first_loss is not None and self.loss is not None else "")
        return self.finding(
            step=steps[0], cause="scores-at-zero",
            summary=f"{tops} {since} (from step {steps[0]}){loss}: the model gets nothing right on the "
                    "evaluation set",
            fix="check that the labels match the data (class ids, mask values, annotation format and paths), that "
                "the head has the dataset's number of classes, and the score's thresholds (confidence, IoU)",
            evidence={"scores": dict(self.low_max), "evaluations": tail, "of_evaluations": self.n_evals,
                      "steps": list(steps), "first_loss": self.first_loss, "last_loss": self.loss,
                      "detected_step": self.last_eval_step},
        )

    def _all_same(self, event: dict[str, Any], data: dict[str, Any]) -> Finding | None:
        # Did the training move since the previous evaluation (its loss changed, the LR is not 0)? Weights at
        # a standstill (seed 002's LR of 0) give identical evaluations at once; while they move, a short
        # repeat is the framework carrying its last evaluation forward over epochs it did not evaluate
        # (Ultralytics: 61 of 100 rows repeat the previous one in runs of 2-3, then change again) or a
        # discrete score settling (an accuracy over a fixed set near convergence): a stale copy of the model
        # stays frozen for good, so it is said at the fifth. So is an LR in its schedule's tail: the weights
        # nearly still by plan (llm.c's cosine to 0 prints lr:0.000000 over its last 2%, 4-decimal
        # evaluations repeating there).
        moved = (self.loss is not None and self.loss_at_eval is not None and self.loss != self.loss_at_eval
                 and self.lr != 0)
        self.loss_at_eval = self.loss
        key = _eval_key(data)
        if key is None:
            return None
        if key != self.key:
            self.key = key
            self.same.clear()
            self.trained = False
            self.loss_at_start = self.loss
        elif moved:
            # a loss printed to 4 decimals repeats between some epochs of a run that learns: one change in
            # the streak is enough to say the training went on
            self.trained = True
        self.same.add(event.get("step"))
        # results printed to 3 significant digits or fewer (`Validation accuracy: 0.551`) repeat by chance
        # between evaluations that differ: five in a row, not three
        coarse = all(float(f"{v:.3g}") == v for _, v in key)
        need = FROZEN_EVALS if coarse or self.trained or self.lr_tail else 3
        fixed = all(_digits(v) <= PLATEAU_DIGITS for _, v in key)
        if fixed and self._settled():
            return None  # a converged run: its training loss as still as its rounded evaluations
        if (self.trained or self.lr_tail) and fixed:
            # a fixed-decimals print (`Validation Loss: 0.0017, Validation L1: 0.2714`, one to four significant
            # digits): the print's step is 0.04-50% of the value, so a model still improving, or on the
            # validation plateau of a run that keeps fitting its training set, prints the same numbers for
            # several evaluations while its training metrics move; a stale copy stays frozen for good
            need = 2 * FROZEN_EVALS
        if self.same.count < need:
            return None
        values = ", ".join(f"{k}={fmt(v)}" for k, v in key)
        steps = self.same.steps
        return self.finding(
            step=steps[0],
            summary=f"{self.same.count} evaluations in a row gave identical results ({values}) at steps "
                    f"{', '.join(str(s) for s in steps)}",
            fix="check that the weights move (lr, optimizer params) and that evaluation runs the model being "
                "trained, not a copy",
            evidence={"metrics": dict(key), "steps": list(steps), "detected_step": event.get("step")},
        )

    def _settled(self) -> bool:
        """The training loss moved less than `SETTLED` (relative) since the streak began: the weights barely
        change, by convergence or a schedule's tail, so evaluations printed to a few digits repeat by design.
        (A stale copy of the model is told by a training loss that goes on falling while the results stay.)"""
        a, b, first = self.loss_at_start, self.loss, self.first_loss
        if a is None or b is None or first is None or not finite(a) or not finite(b) or a == 0 or self.lr == 0:
            return False  # (weights held by an LR of 0 are TG203's own case: seed 002)
        if abs(first - b) <= LEARNED * abs(first):
            return False  # a loss that never fell: not converged, stuck
        # (a loss printed to 2 digits, `0.0011`, moves by its print's step from one batch to the next)
        step = 10.0 ** (math.floor(math.log10(abs(a))) - _digits(a) + 1)
        return abs(b - a) <= max(SETTLED * abs(a), step * 1.000001)

    def _one_frozen(self, event: dict[str, Any], data: dict[str, Any]) -> Finding | None:
        step = event.get("step")
        for name, value in data.items():
            low = str(name).lower()
            if not _model_metric(name) or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            if not any(w in low for w in _CONTINUOUS):
                self.others.setdefault(name, collections.deque(maxlen=FROZEN_EVALS)).append(value)
                continue
            run = self.runs.setdefault(name, collections.deque(maxlen=FROZEN_EVALS))
            if not finite(value) or value == 0:
                run.clear()
                continue
            run.append((step, float(value)))
        if self.lr is not None and self.lr_peak > 0 and self.lr < 0.05 * self.lr_peak:
            return None  # the schedule has decayed: weights that settle are meant to
        for name, run in self.runs.items():
            if len(run) < FROZEN_EVALS:
                continue
            values = [v for _, v in run]
            if all(_digits(v) < FROZEN_DIGITS for v in values):
                continue  # printed to fewer digits than `equal to 5 significant digits` needs: no equality shown
            spread = max(values) - min(values)
            if spread > FROZEN_SPREAD * abs(median(values)):
                continue
            moved = {k: (min(v), max(v)) for k, v in self.others.items()
                     if len(v) == FROZEN_EVALS and all(finite(x) for x in v) and max(v) > min(v)}
            if not moved:
                continue  # nothing else moved either: the all-identical check speaks for that
            level = median(values)
            k = _uniform_classes(level)
            uniform = f": it is ln({k}), the loss of a uniform guess over {k} classes" if k else ""
            other = ", ".join(f"{n} {fmt(lo)}-{fmt(hi)}" for n, (lo, hi) in list(moved.items())[:3])
            return self.finding(
                step=run[0][0], cause=f"frozen-{name}",
                summary=f"eval {name} {level:.6g} at {FROZEN_EVALS} evaluations in a row (steps {run[0][0]}-"
                        f"{run[-1][0]}, spread {fmt(spread)}) while {other} moved{uniform}",
                fix="check that the weights move and the evaluation runs the model being trained; a loss at ln(K): "
                    "check that the labels reach the loss and the output head is not saturated or detached",
                evidence={"metric": name, "value": level, "spread": spread, "steps": [s for s, _ in run],
                          "others": moved, "uniform_classes": k, "detected_step": step},
            )
        return None
