"""TG2xx: is the run learning? Weights that do not move, losses that do not fall or blow up."""

from __future__ import annotations

import bisect
import collections
import math
import re
from typing import Any

from trainguard.findings import EVAL, LOSS, PROBE, UPDATE_RATIO, Finding
from trainguard.rules.rule import Rule, Streak, finite, fmt, median, robust_std
from trainguard.rules.schedule import step_lr

FIXES_201 = {
    "lr-zero": "find what sets the LR to 0: a scheduler sized in micro-batches or epochs that ran out, a warm-up "
               "that starts at 0 and never rises, an `lr` argument of 0; print optimizer.param_groups[0]['lr'] "
               "at a few steps",
    "zero-grad": "make the loss from the model's output without .detach(), .item(), .numpy() or a new tensor in "
                 "between, and call loss.backward() before optimizer.step()",
    "not-in-optimizer": "build the optimizer after the model is complete, from model.parameters() (or add the "
                        "missing parameters as a param group)",
    "wrong-params": "build the optimizer from model.parameters() once the model is final (after .to(device), after "
                    "wrapping); check that loss.backward() runs before optimizer.step()",
}


class WeightsNotUpdating(Rule):
    """TG201 weights-not-updating: optimizer steps that change no weight.

    ## What it detects
    Two sampled optimizer steps in a row whose update ratio (the norm of the change of a sample of
    the model's trainable weights over their norm, measured by the probe on the first `stats_every`
    steps and every `stats_every` steps after) is exactly zero. The finding says which of the usual
    causes the numbers point to: an LR of zero, all gradients zero, a compiled `optimizer.step` that
    replays a no-op, or an optimizer that does not hold the model's parameters.

    ## Why it matters
    A step that changes nothing costs a full step. Seed 002's evaluation loss read 101.40 three times in
    a row because no weight moved. Under `torch.compile(optimizer.step)` a cached graph traced at a step
    whose gradients were all None is a no-op; without a guard on the gradients it replays at every later
    step (pytorch/pytorch#115607, "module: correctness (silent)": the optimizer's `step` count stayed at
    3 while the loop went on).

    ## Example
    `TG201 weights-not-updating [error] at step 1: 2 sampled optimizer steps in a row changed no weight
    (update ratio 0; lr 1.00e-03, grad norm 2.31): the optimizer does not hold the model's parameters`

    ## What to change
    The fix follows the cause the numbers name. An LR of 0: find what sets it there (a schedule sized
    in micro-batches or epochs that ran out, a warm-up that starts at 0); rebuilding the optimizer
    will not help. Zero gradients: make the loss from the model's output without detaching it. Wiring:
    build the optimizer from `model.parameters()` after the model is final (after `.to(device)`,
    after wrapping) and call `loss.backward()` before `optimizer.step()`. For a
    compiled step: run `optimizer.step()` uncompiled to confirm, keep dynamo's guards (no
    `guard_filter_fn` that drops them), never call the compiled step while every gradient is None, and
    use torch >= 2.3 (pytorch/pytorch#121291 added the missing guard).

    ## Known false positives
    Weights in a dtype too coarse for the update (bf16 weights with a tiny LR) also read as zero: a
    real problem, but of precision, not of wiring.

    ## Options
    `trainguard.watch(stats_every=N)` sets how often the update ratio is sampled.
    """

    code, name, severity = "TG201", "weights-not-updating", "error"
    needs = (UPDATE_RATIO,)

    def __init__(self, plan: dict[str, Any]) -> None:
        super().__init__(plan)
        self.zeros = Streak()  # sampled steps in a row with an update ratio of 0
        self.zero_first: dict[str, Any] = {}  # the first of them: its LR and grad norm name the cause
        self.not_in_optimizer: dict[str, Any] | None = None
        self.compiled: dict[str, Any] | None = None  # the probe saw optimizer.step run under torch.compile

    def on_event(self, event: dict[str, Any]) -> None:
        if event.get("kind") == "params-not-in-optimizer":
            self.not_in_optimizer = event.get("data") or {}
        elif event.get("kind") == "contract" and event.get("name") == "optimizer-step-compiled":
            self.compiled = event.get("data") or {}

    def on_step(self, row: dict[str, Any]) -> Finding | None:
        ratio = row.get("update_ratio")
        if not finite(ratio):
            return None
        if ratio > 0:
            self.zeros.clear()
            return None
        if not self.zeros.count:
            self.zero_first = row
        self.zeros.add(row["step"])
        if self.zeros.count < 2:
            return None
        first = self.zero_first
        lr, gn = step_lr(first), first.get("grad_norm")  # the largest LR: one group at 0 (a warmup) is not "LR 0"
        # the structural fact first: parameters the optimizer does not hold explain an LR or a gradient seen
        # as 0 on the copy it does hold (Ultralytics' warm-up starts its bias group at 0)
        if self.not_in_optimizer:
            why = f"{self.not_in_optimizer.get('count')} trainable parameters are not in the optimizer"
            cause = "not-in-optimizer"
        elif finite(lr) and lr == 0:
            why, cause = "the learning rate is 0", "lr-zero"
        elif finite(gn) and gn == 0:
            why, cause = "every gradient is zero (is the loss detached from the model?)", "zero-grad"
        elif self.compiled is not None:
            why = (f"{self.compiled.get('optimizer', 'the optimizer')}.step runs under torch.compile and changes "
                   f"nothing: a cached graph traced when the gradients were None replays a no-op")
            cause = "compiled-step"
        else:
            why, cause = "the optimizer does not update the model's parameters", "wrong-params"
        # the fix is written for the cause the numbers name: rebuilding the optimizer cannot help an LR of 0
        fix = FIXES_201.get(cause, FIXES_201["wrong-params"])
        if cause == "compiled-step":
            fix = ("run optimizer.step() uncompiled to confirm; keep dynamo's guards (no guard_filter_fn that drops "
                   "them), do not call the compiled step while every gradient is None, use torch >= 2.3 "
                   "(pytorch/pytorch#115607)")
        return self.finding(
            step=first["step"],
            summary=f"{self.zeros.count} sampled optimizer steps in a row changed no weight (update ratio 0; "
                    f"lr {fmt(lr)}, grad norm {fmt(gn)}): {why}",
            fix=fix,
            evidence={"steps": list(self.zeros.steps), "update_ratio": 0.0, "lr": lr, "grad_norm": gn,
                      "detected_step": row["step"], "params_not_in_optimizer": self.not_in_optimizer,
                      "optimizer_step_compiled": self.compiled is not None},
            cause=cause,
        )


class ParamsWithoutGrad(Rule):
    """TG202 params-without-grad: trainable parameters that never get a gradient or are in no optimizer group.

    ## What it detects
    Two things the probe sees: at `trainguard.watch`, model parameters with `requires_grad=True` that
    are in no param group of the optimizer; and during training, parameters in the optimizer that have
    no gradient at every sampled step since the start (they are not in the graph of the loss).

    ## Why it matters
    Those parameters never learn, silently: a new head left out of the optimizer, a branch the
    forward never uses, a module re-created after the optimizer was built. Under DDP the second kind
    also breaks gradient reduction.

    ## Example
    `TG202 params-without-grad [warning] at step 0: 2 of 6 trainable parameters are in no optimizer
    param group: head.weight, head.bias`

    ## What to change
    Build the optimizer after the model is complete; set `requires_grad_(False)` on what is frozen on
    purpose; remove or use the unused branch. When torch's reentrant activation checkpointing warned
    "None of the inputs have requires_grad=True" (LoRA adapters inside checkpointed blocks of a frozen
    model), the parameters are meant to train: the finding says so (cause `reentrant-checkpoint`) and
    asks for `use_reentrant=False` or an input that requires grad, never to freeze them.

    ## Known false positives
    Mixture-of-experts layers where an expert receives no token at some steps (their gradient is
    None then), if that happens at every sampled step.

    ## Options
    None.
    """

    code, name, severity = "TG202", "params-without-grad", "warning"
    needs = (PROBE,)
    MIN_SAMPLES = 5

    def __init__(self, plan: dict[str, Any]) -> None:
        super().__init__(plan)
        self.samples: list[tuple[int, int]] = []
        self.broken = False
        self.checkpointed = False  # torch's reentrant checkpoint warned that none of its inputs require grad

    def on_event(self, event: dict[str, Any]) -> Finding | None:
        if event.get("kind") != "params-not-in-optimizer":
            return None
        d = event.get("data") or {}
        names = d.get("names") or []
        return self.finding(
            step=event.get("step") or 0,
            summary=f"{d.get('count')} of {d.get('total_trainable')} trainable parameters are in no optimizer "
                    f"param group: {', '.join(names[:5])}{' ...' if len(names) > 5 else ''}",
            fix="build the optimizer after the model is complete, or requires_grad_(False) what is frozen on purpose",
            evidence=d, cause="not-in-optimizer",
        )

    def on_step(self, row: dict[str, Any]) -> Finding | None:
        if self.broken or not finite(row.get("grad_norm")):
            return None  # only sampled steps count gradients
        extra = row.get("extra") or {}
        missing = extra.get("params_without_grad") or 0
        if not missing:
            self.broken = True  # some sampled step had every gradient: not "never"
            return None
        self.checkpointed = self.checkpointed or bool(extra.get("checkpoint_inputs_no_grad"))
        self.samples.append((row["step"], int(missing)))
        if len(self.samples) < self.MIN_SAMPLES:
            return None
        self.broken = True
        counts = [c for _, c in self.samples]
        head = (f"{min(counts)} parameter tensors in the optimizer had no gradient at every one of the "
                f"{len(counts)} sampled steps since step {self.samples[0][0]}")
        if self.checkpointed:
            # The fix is written for this cause: they are meant to train (LoRA adapters inside checkpointed
            # blocks of a frozen model); freezing them, the generic advice, would stop what the run is for.
            return self.finding(
                step=self.samples[0][0], cause="reentrant-checkpoint",
                summary=f"{head}: torch's reentrant activation checkpointing warned that none of its inputs "
                        "require grad, so nothing inside the checkpointed blocks gets a gradient",
                fix="pass use_reentrant=False to torch.utils.checkpoint.checkpoint (Hugging Face: "
                    "gradient_checkpointing_enable(gradient_checkpointing_kwargs={'use_reentrant': False})), or make "
                    "the block's input require grad (model.enable_input_require_grads()); do not freeze these "
                    "parameters: they are the ones meant to train",
                evidence={"samples": self.samples, "checkpoint_inputs_no_grad": True, "detected_step": row["step"]},
            )
        return self.finding(
            step=self.samples[0][0],
            summary=f"{head}: they are not in the loss's graph",
            fix="use or remove the unused module, or requires_grad_(False) what is frozen on purpose",
            evidence={"samples": self.samples, "detected_step": row["step"]}, cause="never-grad",
        )


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
# a run from scratch often scores 0 through its first epochs (a detector's warm-up: no box passes the
# confidence threshold yet); ten evaluations at the floor are no warm-up any more
SCORES_AT_ZERO_EVALS = 10


def _score(name: Any) -> bool:
    low = str(name).lower()
    return _SCORE.search(low) is not None and not any(w in low for w in _NOT_SCORE) and _model_metric(name)


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
    evaluations are not enough: the streak must reach five (ten when every result has one significant
    digit, like `Val Loss=0.0005`). And at the end of the run: every higher-is-better score of the
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
        self.loss: float | None = None  # the latest training loss
        self.loss_at_eval: float | None = None  # the training loss at the previous evaluation
        self.trained = False  # the training moved at some point between the evaluations of the streak
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
        # stays frozen for good, so it is said at the fifth.
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
        elif moved:
            # a loss printed to 4 decimals repeats between some epochs of a run that learns: one change in
            # the streak is enough to say the training went on
            self.trained = True
        self.same.add(event.get("step"))
        # results printed to 3 significant digits or fewer (`Validation accuracy: 0.551`) repeat by chance
        # between evaluations that differ: five in a row, not three
        coarse = all(float(f"{v:.3g}") == v for _, v in key)
        need = FROZEN_EVALS if coarse or self.trained else 3
        if self.trained and all(float(f"{v:.1g}") == v for _, v in key):
            # one significant digit (`Val Loss=0.0005`): the print's step is 10-50% of the value, so a model
            # still improving prints the same number for many evaluations while its training loss moves
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

    def _judge(self, step: int, can_wait: bool, can_wait_longer: bool = False) -> Finding | None:
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


class _Blocks:
    """The divergence test on one series: block medians, the best block, and the bar above it.

    Blocks are (first step, last step, median, noise). Only these are kept, not every block: a list of
    all of them grows with the log, and a scan of it at every block makes a long log quadratic.
    """

    def __init__(self, k: int) -> None:
        self.k = k
        self.block: list[float] = []
        self.block_start = 0  # the first step of the block being filled (set by its first value)
        self.count = 0  # blocks so far
        self.first: float | None = None  # the first block's median: where the run started
        self.recent: collections.deque[tuple[int, int, float, float]] = collections.deque(maxlen=3)
        self.best: tuple[int, int, float, float] | None = None  # the lowest block before the last two
        self.need = 0.0  # how far above the best a block must be to count as diverged
        self.onset: tuple[int, int, float, float] | None = None  # the first block after the best above half that

    def add(self, step: int, value: float) -> tuple[Any, ...] | None:
        """Adds a value; (best, latest, previous, onset, need, first) once the last two blocks diverged."""
        if not self.block:
            self.block_start = step
        self.block.append(value)
        if len(self.block) < self.k:
            return None
        blk = (self.block_start, step, median(self.block), robust_std(self.block))
        self.block = []
        self.count += 1
        if self.first is None:
            self.first = blk[2]
        self.recent.append(blk)
        if self.count >= 3:
            # the best block before the last two, kept as blocks age into that range
            aged = self.recent[0]
            if self.best is None or aged[2] < self.best[2]:
                self.best, self.onset = aged, None
                self.need = max(3 * aged[3], 0.5 * abs(aged[2]), 0.25 * (self.first - aged[2]))
                after = [self.recent[1], self.recent[2]]  # every block after a new best
            else:
                after = [blk]  # the best and its bar are unchanged: only the new block is news
            # The onset is the first block after the best that rose by half the bar. The best changes
            # only to the block that just aged, so the blocks after it are always the last two, then
            # each new one: watching them as they come finds the onset a scan of all blocks would.
            for cand in after:
                if self.onset is None and cand[0] > self.best[1] and cand[2] > self.best[2] + 0.5 * self.need:
                    self.onset = cand
        if self.count < 4:
            return None
        best, need = self.best, self.need
        if best is None:  # (there is one from the third block on)
            return None
        b, c = self.recent[1], self.recent[2]
        if c[2] - best[2] <= need or b[2] - best[2] <= need:
            return None
        return best, c, b, self.onset or c, need, self.first  # c itself clears the bar: an onset was seen


FEW_ROWS = 16  # fewer loss rows than this: judged at the end by `LossDiverging.end`
FEW_RISE = 1.3  # every training row after the best, and the evaluations' median, this far above their best
FEW_EVAL_RISE = 1.2  # the last evaluation


class LossDiverging(Rule):
    """TG206 loss-diverging: the loss climbs back up, well above the best level it reached.

    ## What it detects
    The loss is summarised by block medians (blocks of 2% of the planned run, 10 to 50 steps). The
    rule fires when the two latest blocks are both above the best earlier block by more than the
    largest of: 3x that block's noise, half the best level, and a quarter of the progress the run had
    made (first block minus best). When the loop reports the weights of its loss parts and they
    change (a curriculum), the weighted total rises by design: the rule then judges each part on its
    own, unweighted, and fires only for a part that climbs by the same test and whose climb, at its
    weight now, would clear the total's own bar; the weights explain the rest.

    ## Why it matters
    A loss that turns round and climbs is usually heading for NaN: an LR too high for this stage, a
    warmup too short, an optimizer state gone bad. Caught early, the run can be stopped and resumed
    from the checkpoint before the climb with a lower LR.

    ## Example
    `TG206 loss-diverging [error] at step 501: the loss rose from its best 0.412 (steps 481-500) to 2.45
    (steps 521-540) and stays there (median 3.12 over steps 501-520)`

    ## What to change
    Lower the peak LR or lengthen the warmup, clip gradients, and resume from the last good checkpoint.

    ## Known false positives
    A curriculum that deliberately switches to harder data (the loss of the new data is higher); one
    whose weights are applied but not reported.

    ## Options
    A run with 4 to 15 loss rows (too few for blocks) is judged at its end (cause `few-rows`): every
    training row after its best at least 1.3x the best, and the evaluation loss rising with it (the
    evaluations after the best training row 1.3x the best before it in median, the last 1.2x).

    Not judged for a job watched with `trainguard.watch(..., learning=False)`.
    """

    code, name, severity = "TG206", "loss-diverging", "error"
    needs = (LOSS,)

    def __init__(self, plan: dict[str, Any]) -> None:
        super().__init__(plan)
        self.k = self.window(0.02, 10, 50) if self.total_steps else 25
        self.total = _Blocks(self.k)
        self.parts: dict[str, _Blocks] = {}
        self.first_weights: dict[str, float] = {}
        self.weighted = False  # the reported weights changed: the total is judged through its parts
        self.rows: list[tuple[int, float]] = []  # the first training losses, for a run too short for blocks
        self.evals: list[tuple[Any, float]] = []  # its evaluation losses
        self.said = False

    def on_event(self, event: dict[str, Any]) -> None:
        value = (event.get("data") or {}).get("loss")
        # only while the run can still be a short one (bounded state on a long log)
        if event.get("kind") == "eval" and finite(value) and len(self.rows) < FEW_ROWS and len(self.evals) < 2000:
            self.evals.append((event.get("step"), float(value)))

    def end(self) -> Finding | None:
        """A run whose loss rows are too few for blocks (the Trainer logging every 500 of 2,640 steps: five
        rows), judged once at its end: its training loss ends well above its best row and never came back near
        it, and the evaluation loss says the same (the evaluations after the best training row well above the
        best before it). Both rising is a divergence; a training loss that falls while the evaluation loss
        rises is overfitting, and not this."""
        rows = self.rows
        if self.said or not self.learning or not 4 <= len(rows) < FEW_ROWS:
            return None
        b = min(range(len(rows)), key=lambda i: rows[i][1])
        best_step, best = rows[b]
        after = [v for _, v in rows[b + 1:]]
        if best <= 0 or len(after) < 2 or min(after) < FEW_RISE * best:
            return None
        before = [v for s, v in self.evals if isinstance(s, (int, float)) and s <= best_step]
        later = [v for s, v in self.evals if isinstance(s, (int, float)) and s > best_step]
        if not before or len(later) < 3:
            return None
        e_best = min(before)
        if median(later) < FEW_RISE * e_best or later[-1] < FEW_EVAL_RISE * e_best:
            return None
        return self.finding(
            step=best_step, cause="few-rows",
            summary=f"the loss rose from its best {fmt(best)} (step {best_step}) to {fmt(max(after))} and never came "
                    f"back near it ({fmt(after[-1])} at step {rows[-1][0]}, {len(after)} rows after the best); the "
                    f"evaluation loss rose with it, from {fmt(e_best)} to a median of {fmt(median(later))} over "
                    f"{len(later)} evaluations, ending at {fmt(later[-1])}",
            fix="lower the peak LR or lengthen the warmup, clip gradients, resume from the last good checkpoint",
            evidence={"best": best, "best_step": best_step, "after": after, "eval_best": e_best,
                      "eval_later_median": median(later), "eval_last": later[-1], "detected_step": rows[-1][0]},
        )

    def on_step(self, row: dict[str, Any]) -> Finding | None:
        if not self.learning:
            return None
        if finite(row.get("loss")) and len(self.rows) < FEW_ROWS:
            self.rows.append((row["step"], float(row["loss"])))
        weights = row.get("weights") or {}
        for name, w in weights.items():
            if finite(w) and abs(self.first_weights.setdefault(name, w) - w) > 1e-9 * max(1.0, abs(w)):
                self.weighted = True
        found = None
        loss = row.get("loss")
        if finite(loss):
            got = self.total.add(row["step"], loss)
            if got is not None and not self.weighted:
                found = self._found(row, got, "the loss", None, weights)
                self.said = True
        for name, value in (row.get("parts") or {}).items():
            if finite(value) and (name in self.parts or len(self.parts) < 16):
                got = self.parts.setdefault(name, _Blocks(self.k)).add(row["step"], value)
                if got is None or not self.weighted or found is not None or self.total.best is None:
                    continue
                # the part's climb must matter to the total: its rise, at its weight now, past the bar the
                # total itself would have to clear
                w = weight if finite(weight := weights.get(name)) else 1.0
                if abs(w) * (got[1][2] - got[0][2]) > self.total.need:
                    found = self._found(row, got, f"loss part {name}", f"part-{name}", weights)
        return found

    def _found(self, row: dict[str, Any], got: tuple[Any, ...], what: str, cause: str | None,
               weights: dict[str, Any]) -> Finding:
        best, c, b, onset, need, first = got
        note = (" (judged unweighted: the reported weights change over the run, and explain only their own "
                "share of the total)" if cause else "")
        return self.finding(
            step=onset[0], cause=cause,
            summary=f"{what} rose from its best {fmt(best[2])} (steps {best[0]}-{best[1]}) to {fmt(c[2])} "
                    f"(steps {c[0]}-{c[1]}) and stays there (median {fmt(b[2])} over steps {b[0]}-{b[1]}){note}",
            fix="lower the peak LR or lengthen the warmup, clip gradients, resume from the last good checkpoint",
            evidence={"best": best[2], "best_steps": [best[0], best[1]], "latest": c[2],
                      "latest_steps": [c[0], c[1]], "first": first, "threshold": need,
                      "weights": {k: v for k, v in weights.items() if finite(v)} if cause else None,
                      "detected_step": row["step"]},
        )


class LossDiverged(Rule):
    """TG208 loss-diverged: the loss far above where it started, with updates far larger than weights take.

    ## What it detects
    The median of the last 5 losses more than 10x the run's initial loss (with the model's output size
    V known: the lowest of its first 3, the first computed before any update, and more than 10x ln(V),
    a uniform guess's loss; without it: the highest of the first 3, so a noisy loss's lucky first
    draw is no start), while the probe's sampled update-to-weight ratios in those
    steps say why: one of them above 0.1 (each step changed the sampled weights by a tenth of their
    norm or more; about 1e-3 is typical for Adam), or 10x above the run's own median ratio before the
    climb. No NaN is needed: a loss that settles at hundreds of times a uniform guess's never becomes one.
    It decides once.

    ## Why it matters
    An LR off by orders of magnitude (2 typed for 2.5e-4, OpenNMT/OpenNMT-tf#744) throws the weights
    around from the first update: the loss jumps and stays far above where it started, and a
    NaN-only check says nothing for the rest of the run. `loss-diverging` needs a best level first
    to climb from; this needs only the start.

    ## Example
    `TG208 loss-diverged [error] at step 2: the loss went from 5.85 at its start to 181 (median of
    steps 3-7), 31x, while the updates changed the weights by 3.02, 0.653, 0.346 of their norm (about
    1e-3 is typical; above 0.1 diverges) at lr 2; gradient norm 0.837 -> 42.1`

    ## What to change
    Lower the LR (the ratio says by how much: a ratio of 1 at an LR of 2 asks for about 1e-3 of it),
    add a warm-up, clip gradients; check the LR's units (a value meant for SGD given to Adam).

    ## Known false positives
    A loss that grows by design (a reinforcement-learning loss that scales with the returns, a
    curriculum that switches a loss part on at full weight) while the weights happen to move fast.
    Update ratios are large too where the weights shrink towards zero (a regression converging to a
    zero weight): the loss has to climb tenfold as well.

    ## Options
    `trainguard.watch(stats_every=N)` sets how often the update ratio is sampled.
    """

    code, name, severity = "TG208", "loss-diverged", "error"
    needs = (LOSS, UPDATE_RATIO)
    RISE = 10.0  # the recent median over the initial loss
    TOO_LARGE = 0.1  # an update a tenth of the weights' norm: 100x Adam's typical 1e-3
    OWN_JUMP = 10.0  # or this many times the run's own median ratio before the climb

    def __init__(self, plan: dict[str, Any]) -> None:
        super().__init__(plan)
        self.first: list[tuple[int, float, Any, Any]] = []  # step, loss, lr, grad norm of the first 3 steps
        self.recent: collections.deque[tuple[int, float]] = collections.deque(maxlen=5)
        self.ratios: collections.deque[tuple[int, float, Any, Any]] = collections.deque(maxlen=8)  # since the climb
        self.calm: collections.deque[tuple[int, float, Any, Any]] = collections.deque(maxlen=50)  # before it
        size = plan.get("output_size")
        self.size = int(size) if finite(size) and size >= 2 else None  # ln(V): a uniform guess's loss
        self.done = False

    def on_step(self, row: dict[str, Any]) -> Finding | None:
        if self.done or not self.learning:
            return None
        loss, ratio = row.get("loss"), row.get("update_ratio")
        if not finite(loss):
            return None
        step = row["step"]
        if len(self.first) < 3:
            self.first.append((step, float(loss), step_lr(row), row.get("grad_norm")))
        # Where the loss started. With the output size known (a classifier, a language model), the lowest of
        # the first three, held to ln(V) too below; without it, the highest: a noisy loss (a regression on
        # random inputs) may draw a first value 20x under its level, and "10x its start" must not be that.
        start = (min if self.size else max)(v for _, v, _, _ in self.first)
        if start <= 0:
            self.done = True  # a loss that can be zero or negative has no "times its start"
            return None
        self.recent.append((step, float(loss)))
        sample = (step, float(ratio), step_lr(row), row.get("grad_norm")) if finite(ratio) else None
        if loss > 3 * start:
            if not self.ratios and self.calm and self.calm[-1][0] == step - 1:
                # the update of the step before the climb's first loss made that loss: it is the climb's
                self.ratios.append(self.calm.pop())
            if sample is not None:
                self.ratios.append(sample)
        else:
            self.ratios.clear()
            if sample is not None:
                self.calm.append(sample)
        if len(self.recent) < 5 or len(self.first) < 3:
            return None
        level = median([v for _, v in self.recent])
        if level <= self.RISE * start or (self.size and level <= self.RISE * math.log(self.size)):
            return None
        own = median([r for _, r, _, _ in self.calm]) if len(self.calm) >= 3 else None
        big = [r for r in self.ratios if r[1] > self.TOO_LARGE or (own is not None and r[1] > self.OWN_JUMP * own
                                                                    and r[1] > 0.01)]
        if not big:
            return None
        self.done = True
        onset = next((s for s, v in self.recent if v > 3 * start), self.recent[0][0])
        onset = min(onset, self.ratios[0][0])
        lr = next((r[2] for r in reversed(big) if finite(r[2])), step_lr(row))
        first_gn = next((g for _, _, _, g in self.first if finite(g)), None)
        last_gn = max((g for _, _, _, g in self.ratios if finite(g)), default=None)
        shown = ", ".join(fmt(r[1]) for r in list(self.ratios)[:5])
        own_words = f"; this run's own median before the climb was {fmt(own)}" if own is not None else ""
        gn = (f"; gradient norm {fmt(first_gn)} -> {fmt(last_gn)}" if first_gn is not None and last_gn is not None
              else "")
        at_lr = f" at lr {fmt(lr)}" if finite(lr) else ""
        return self.finding(
            step=onset, cause="update-too-large",
            summary=f"the loss went from {fmt(start)} at its start to {fmt(level)} (median of steps "
                    f"{self.recent[0][0]}-{self.recent[-1][0]}), {level / start:.0f}x, while the updates changed the "
                    f"weights by {shown} of their norm (about 1e-3 is typical; above 0.1 diverges{own_words}){at_lr}"
                    f"{gn}: the LR is far too high for this model",
            fix=f"lower the LR{' (' + fmt(lr) + ')' if finite(lr) else ''} by 10x-1000x, add a warm-up and clip "
                "gradients; check its units (an SGD value given to Adam, a typo in the exponent)",
            evidence={"initial_loss": start, "loss_median": level, "ratio": level / start,
                      "steps": [self.recent[0][0], self.recent[-1][0]],
                      "update_ratios": [[s, r] for s, r, _, _ in self.ratios], "own_median_ratio": own,
                      "lr": lr, "grad_norm_first": first_gn, "grad_norm_max": last_gn, "detected_step": step},
        )


class LossSpike(Rule):
    """TG207 loss-spike: one step's loss far above the run's recent losses, beyond the run's own noise tail.

    ## What it detects
    Judged in log space (a loss's noise grows with its level, and a jump is a ratio): the log of a
    loss against the median log of the last 50 steps. A spike is more than 10 robust standard
    deviations of those logs above it, and above the run's own noise tail by a factor of 4 (the 99th
    percentile of how far its losses have stood above their recent median so far: a run whose
    per-batch losses often jump 6x needs a jump past 24x). It must also matter on the run's scale:
    above the median by more than 50% of it and by more than 5% of the run's starting loss. Needs 30
    steps. A spike an order of magnitude larger than any reported before is reported again, so the
    largest one is never hidden behind a small first one, once the loss has come back down in between
    (a loss that keeps climbing is `loss-diverging`'s). Losses at or below zero are judged in
    linear terms (10 robust standard deviations).

    ## Why it matters
    A spike is a bad batch (corrupt sample, wrong label scale, an outlier sequence length), a numerical
    hiccup, or the first sign of instability; large spikes leave the optimizer's moments polluted
    for many steps. Knowing the step lets you find the batch.

    ## Example
    `TG207 loss-spike [warning] at step 16149: loss 126 against a median of 0.0502 over the last 50
    steps (2,504x; 99% of this run's rises above its median stay below 2x)`

    ## What to change
    Look at the batch of that step (`guard.batches` records which one it was); clip gradients; skip or
    fix the sample.

    ## Known false positives
    A loss that changes definition mid-run (a new loss part switched on at full weight).

    ## Options
    None.
    """

    code, name, severity = "TG207", "loss-spike", "warning"
    needs = (LOSS,)
    TAIL_FACTOR = 4.0  # a spike stands this many times further above the median than the run's own 99th percentile
    BIN = 0.02  # log-space width of the tail histogram's bins; 1,000 bins reach e^20

    def __init__(self, plan: dict[str, Any]) -> None:
        super().__init__(plan)
        self.hist: collections.deque[float] = collections.deque(maxlen=50)
        self.ordered: list[float] = []  # the same 50 losses, sorted: the median without a sort per step
        self.start: list[float] = []
        self.start_median: float | None = None
        self.tail = [0] * 1000  # how far (log) each loss stood above its recent median: a bounded histogram
        self.tail_n = 0
        self.reported_order = -1  # the order of magnitude of the largest spike reported so far
        self.settled = True  # the loss came back near its median after the last spike reported

    def _tail_quantile(self, q: float = 0.99) -> float:
        need, seen = q * self.tail_n, 0
        for i, c in enumerate(self.tail):
            seen += c
            if seen >= need:
                return (i + 1) * self.BIN
        return len(self.tail) * self.BIN

    def on_step(self, row: dict[str, Any]) -> Finding | None:
        loss = row.get("loss")
        if not finite(loss):
            return None
        found = None
        if len(self.start) < 10:
            self.start.append(loss)
            if len(self.start) == 10:
                self.start_median = median(self.start)
        n = len(self.ordered)
        if n >= 30:
            assert self.start_median is not None  # the first 10 losses came before these 30
            s = self.ordered
            med = s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])
            positive = s[0] > 0 and loss > 0
            rise = math.log(loss / med) if positive else None
            jump = loss - med
            if not self.settled and loss <= 3 * med:
                self.settled = True
            # A jump must also matter on the run's own scale: 5% of where its loss started (30 steps
            # in, the 10 starting losses are in). These two bars are cheap; the robust std costs two
            # sorts and is worked out only for a loss that clears them.
            if jump > 0.5 * abs(med) and jump > 0.05 * abs(self.start_median):
                found = self._judge(row, loss, med, rise)
            if rise is not None and rise > 0:  # into the tail after it was judged against the tail before it
                self.tail[min(len(self.tail) - 1, int(rise / self.BIN))] += 1
                self.tail_n += 1
        if len(self.hist) == self.hist.maxlen:
            del self.ordered[bisect.bisect_left(self.ordered, self.hist[0])]  # the loss about to leave
        self.hist.append(loss)
        bisect.insort(self.ordered, loss)
        return found

    def _judge(self, row: dict[str, Any], loss: float, med: float, rise: float | None) -> Finding | None:
        values = list(self.hist)
        if rise is not None:
            logs = [math.log(v) for v in values]
            sd = max(robust_std(logs), 1e-3)
            tail = self._tail_quantile()
            if rise <= 10 * sd or rise <= tail + math.log(self.TAIL_FACTOR):
                return None
            ratio = loss / med
            order = int(math.log10(ratio))
            if order <= self.reported_order:
                return None
            if self.reported_order >= 0 and not self.settled:
                return None  # the loss never came back down since the last one: a climb, not isolated spikes
            first, self.reported_order, self.settled = self.reported_order < 0, order, False
            return self.finding(
                step=row["step"], cause=None if first else f"1e{order}",
                summary=f"loss {fmt(loss)} against a median of {fmt(med)} over the last {len(values)} steps "
                        f"({ratio:,.0f}x; 99% of this run's rises above its median stay below {math.exp(tail):.2g}x)",
                fix="look at that step's batch; clip gradients; skip or fix the sample",
                evidence={"loss": loss, "median": med, "ratio": ratio, "log_robust_std": sd,
                          "tail_99_ratio": math.exp(tail), "detected_step": row["step"]},
            )
        sd = max(robust_std(values), 1e-3 * abs(med), 1e-12)
        if loss - med <= 10 * sd or self.reported_order >= 0:
            return None
        self.reported_order = 0
        return self.finding(
            step=row["step"],
            summary=f"loss {fmt(loss)} against a median of {fmt(med)} over the last {len(values)} "
                    f"steps (robust std {fmt(sd)})",
            fix="look at that step's batch; clip gradients; skip or fix the sample",
            evidence={"loss": loss, "median": med, "robust_std": sd, "detected_step": row["step"]},
        )
