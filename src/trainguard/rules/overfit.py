"""TG209: an evaluation loss that climbed far above its best while the training loss kept falling."""

from __future__ import annotations

import collections
from typing import Any

from trainguard.findings import EVAL, LOSS, Finding
from trainguard.rules.rule import Rule, finite, fmt, median


class EvalLossRising(Rule):
    """TG209 eval-loss-rising: the evaluation loss doubled from its best and stayed there, while the
    training loss kept falling.

    ## What it detects
    The evaluation loss (an evaluation's `loss`), each value taken as the median of it and the two
    before (one noisy evaluation moves nothing), at three evaluations in a row at least 2x its best
    such level and at least 0.1 above it, while the training loss (the median of the 20 steps before
    each evaluation) fell by a quarter or more since that best and is now at most half the evaluation
    level: the model goes on learning its training data and gets worse on the rest. (An evaluation loss
    that rises with a training loss of its size is an unstable optimisation, not memorising: a linear
    probe at a high LR whose test accuracy still improves.) A loss that creeps up by a third over many evaluations, as
    fine-tuning runs do once they have learned the task, is not it; nor an evaluation loss that swings
    2x from one evaluation to the next around a level that does not rise; nor both losses rising
    (`loss-diverging`).

    ## Why it matters
    The model has memorised its training data: every step past the best evaluation makes it worse on
    data it has not seen, and the model at the end of the run is not the one to keep. The run's compute
    past that point is spent on the wrong thing (a nanoGPT character model: validation loss 2.15 at
    step 1,250, 4.92 at step 5,000, training loss 0.12).

    ## Example
    `TG209 eval-loss-rising [warning] at step 3750: the evaluation loss rose from its best level 2.15
    (step 1250) to 4.66 (step 4250), 2.2x, held over the last 3 evaluations, while the training loss
    fell from 1.7 to 0.218: the model overfits its training data`

    ## What to change
    Keep the checkpoint of the best evaluation and stop there (early stopping on the evaluation loss);
    regularise (dropout, weight decay, data augmentation), train on more data or a smaller model.

    ## Known false positives
    An evaluation set that changes during the run (curriculum stages, a new validation split); an
    evaluation loss that is not the training objective's (a different metric named `loss`).

    ## Options
    None.
    """

    code, name, severity = "TG209", "eval-loss-rising", "warning"
    needs = (LOSS, EVAL)
    since = "0.2.0"
    TIMES = 2.0  # the evaluation loss's level over its best level
    ABOVE = 0.1  # and this much above it, in the loss's own units
    HELD = 3  # evaluations in a row
    FELL = 0.75  # the training loss now at most this share of what it was at the best evaluation
    GAP = 2.0  # and the evaluation level at least this many times the training loss: memorised, not unstable

    def __init__(self, plan: dict[str, Any]) -> None:
        super().__init__(plan)
        self.recent: collections.deque[float] = collections.deque(maxlen=20)  # training losses before the next eval
        self.evals: collections.deque[float] = collections.deque(maxlen=3)  # the last evaluation losses
        # (step, evaluation level, training loss then): the best level so far, and the levels held above it
        self.best: tuple[int, float, float | None] | None = None
        self.held: collections.deque[tuple[int, float, float | None]] = collections.deque(maxlen=self.HELD)
        self.pending: tuple[int, list[float], float | None] | None = None  # this step's evaluation, its batches
        self.done = False

    def on_step(self, row: dict[str, Any]) -> Finding | None:
        loss = row.get("loss")
        if finite(loss):
            self.recent.append(float(loss))
        return None

    def on_event(self, event: dict[str, Any]) -> Finding | None:
        if self.done or event.get("kind") != "eval" or not isinstance(event.get("step"), int):
            return None
        loss = (event.get("data") or {}).get("loss")
        if not finite(loss):
            return None
        # Several at one step are one evaluation's batches (`Test: [10/242] Loss ...`): their mean is its loss,
        # taken when the next step's evaluation begins (or at the end)
        found = None
        if self.pending is not None and event["step"] != self.pending[0]:
            found = self._evaluation(*self.pending)
            self.pending = None
        if self.pending is None:
            self.pending = (event["step"], [], median(list(self.recent)) if self.recent else None)
        if len(self.pending[1]) < 10_000:
            self.pending[1].append(float(loss))
        return found

    def end(self) -> Finding | None:
        if self.pending is None or self.done:
            return None
        pending, self.pending = self.pending, None
        return self._evaluation(*pending)

    def _evaluation(self, step: int, losses: list[float], train: float | None) -> Finding | None:
        self.evals.append(sum(losses) / len(losses))
        if len(self.evals) < 3:
            return None
        now = (step, median(list(self.evals)), train)
        if self.best is None or now[1] <= self.best[1]:
            self.best = now
            self.held.clear()
            return None
        best = self.best[1]
        if not (best > 0 and now[1] >= self.TIMES * best and now[1] >= best + self.ABOVE):
            self.held.clear()
            return None
        self.held.append(now)
        return self._judge() if len(self.held) >= self.HELD else None

    def _judge(self) -> Finding | None:
        assert self.best is not None
        best_step, best, best_train = self.best
        now_step, now, now_train = self.held[-1]
        if best_train is None or now_train is None or not now_train <= self.FELL * best_train:
            return None  # training not learning on past the best: no memorising to show (rising: divergence)
        if not now >= self.GAP * now_train:
            return None  # a model that does about as well on data it never saw has not memorised its own
        self.done = True
        last = list(self.held)
        return self.finding(
            step=last[0][0],
            summary=f"the evaluation loss rose from its best level {fmt(best)} (step {best_step}) to {fmt(now)} (step "
                    f"{now_step}), {now / best:.1f}x, held over the last {self.HELD} evaluations, while the training "
                    f"loss fell from {fmt(best_train)} to {fmt(now_train)}: the model overfits its training data",
            fix="keep the checkpoint of the best evaluation and stop there (early stopping on the evaluation loss); "
                "regularise (dropout, weight decay, augmentation), or train on more data or a smaller model",
            evidence={"best": {"step": best_step, "eval_loss": best, "train_loss": best_train},
                      "last": [{"step": s, "eval_loss": v, "train_loss": t} for s, v, t in last],
                      "ratio": now / best, "detected_step": now_step, "level": "median of 3 evaluations"},
        )
