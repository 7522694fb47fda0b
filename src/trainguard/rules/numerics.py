"""TG3xx: numbers gone bad. NaN and inf in the loss and the gradients, an AMP loss scale that collapses."""

from __future__ import annotations

import collections
import collections.abc
from pathlib import Path
from typing import Any

from trainguard.findings import GRAD_NORM, LOSS, LOSS_SCALE, Finding
from trainguard.rules.rule import Rule, finite, fmt, median

RATE_ERROR = 0.01  # above 1% of steps, non-finite values are an error, not an accident


def _nonfinite(value: Any) -> bool:
    if type(value) is float:  # the common case, checked once per field per step
        return value - value != 0.0  # nan and inf give nan
    return isinstance(value, (int, float)) and not finite(value)


class _RateRule(Rule):
    """Shared by the two non-finite rules: a warning at the first occurrence, an error above 1% of steps."""

    what = ""

    def __init__(self, plan: dict[str, Any]) -> None:
        super().__init__(plan)
        self.steps = 0
        self.count = 0  # steps with a hit
        self.since_onset = 0  # steps seen from the first hit on (the first included)
        self.hits: list[int] = []  # the first 50 of them: the evidence shows no more, and a log may hold millions

    def _count(self, row: dict[str, Any], hit: bool, first: Finding | None) -> list[Finding] | None:
        self.steps += 1
        if self.count or hit:
            self.since_onset += 1
        if not hit:
            return None
        self.count += 1
        if len(self.hits) < 50:
            self.hits.append(row["step"])
        out = [first] if first is not None else []
        rate = self.count / self.steps
        if self.count >= 2 and rate > RATE_ERROR:
            # the counts are those of the moment it is found (the run may go on): said with that step
            since = (f"every step since step {self.hits[0]}" if self.count == self.since_onset
                     else f"{self.count} of the {self.since_onset} steps since step {self.hits[0]}")
            out.append(self.finding(
                step=self.hits[0], severity="error", cause="rate",
                summary=f"{self.what} at {self.count} of the {self.steps} steps seen by step {row['step']} "
                        f"({rate:.1%}, above 1%), {since}: this is no longer an accident",
                fix="find the cause (the batches of those steps, the LR, fp16 overflow); do not clamp it away",
                evidence={"steps": list(self.hits), "count": self.count, "of_steps": self.steps, "rate": rate,
                          "steps_since_onset": self.since_onset,
                          "detected_step": row["step"]},
            ))
        return out


class NonfiniteLoss(_RateRule):
    """TG301 nonfinite-loss: a NaN or inf loss (or loss part), or one clamped to exactly zero.

    ## What it detects
    The first step whose loss or any reported loss part is NaN or inf; and a loss part that reads
    exactly 0.0 at an isolated step although its recent values are well above zero (a non-finite value
    replaced by 0 before it was reported). The first occurrence is a warning; once such steps exceed 1%
    of the steps seen (and there are at least two), an error finding follows with the rate. An
    evaluation whose loss (any metric named `*loss*`) is NaN or inf is named once: a warning when it is
    the only loss the run shows, info when the training losses beside it are finite (the evaluation's own
    arithmetic failed: a column broken from the first row, an epoch in which nothing was predicted).

    ## Why it matters
    A NaN loss puts NaN into every weight it touches; clamping it to zero hides the symptom and keeps
    the bad batch in the data. Seed 001 clamped NaN losses to zero and planned to "watch the frequency":
    this rule is that watch, with the step of each occurrence.

    ## Example
    `TG301 nonfinite-loss [warning] at step 1184: loss part lm is 0 exactly at step 1184 while its
    median over the previous 20 steps is 3.12: a non-finite value clamped to zero?`

    ## What to change
    Look at the batch of that step: when the loop reads its data through `guard.batches(loader)`, the
    probe saves that step's micro-batches (host tensors) as `nonfinite-step<N>.pt` in the run folder,
    for `torch.load` and a replay. Check for log(0), division by a zero count (an all-padding batch),
    fp16 overflow; fix the cause instead of clamping.

    ## Known false positives
    A loss part that can legitimately reach exactly zero (a hinge or margin loss). Not one: two or more
    parts at exactly 0 at the same step beside a finite loss (a detector's foreground-only box and class
    losses on a batch with no positive target, YOLOX's `iou_loss: 0.0 ... cls_loss: 0.0`).

    ## Options
    None.
    """

    code, name, severity = "TG301", "nonfinite-loss", "warning"
    needs = (LOSS,)
    what = "non-finite (or zero-clamped) losses"

    def __init__(self, plan: dict[str, Any]) -> None:
        super().__init__(plan)
        self.part_hist: dict[str, collections.deque[float]] = {}
        self.eval_hits = 0  # evaluations with a non-finite loss
        self.evals = 0  # evaluations seen
        self.train_finite = 0  # training losses seen, all finite so far (a non-finite one is the step finding)
        # a non-finite evaluation seen before any training loss (a TensorBoard folder gives an epoch's val
        # scalars before its train scalars): judged at the next training row, or at the end without one
        self.pending: tuple[Any, dict[str, Any], int] | None = None

    def on_event(self, event: dict[str, Any]) -> Finding | None:
        """An evaluation's loss is a loss too: NaN there (Ultralytics' `val/cls_loss`) is the same fault,
        seen on held-out data, and often the only place a per-epoch table shows it. But when the training
        losses beside it are finite, the weights are finite too: the evaluation's own arithmetic failed,
        not the training. Ultralytics 8.0.x wrote `val/cls_loss = inf` in every row of healthy runs (a broken
        metric, non-finite from the first evaluation); its validator gives NaN box/cls/dfl losses for an
        epoch in which the model predicted nothing (P, R and mAP 0), finite again once it does. So with
        finite training losses the finding is info; without training losses the evaluation is all there is,
        and it stays a warning."""
        if event.get("kind") != "eval":
            return None
        self.evals += 1
        data = event.get("data") or {}
        bad = {k: v for k, v in data.items() if "loss" in str(k).lower() and _nonfinite(v)}
        if not bad:
            return None
        self.eval_hits += 1
        if self.eval_hits > 1:
            return None
        if not self.train_finite:
            self.pending = (event.get("step"), bad, self.evals)
            return None
        return self._eval_finding(event.get("step"), bad, self.evals)

    def end(self) -> Finding | None:
        if self.pending is None:
            return None
        step, bad, index = self.pending
        self.pending = None
        return self._eval_finding(step, bad, index)

    def _eval_finding(self, step: Any, bad: dict[str, Any], index: int) -> Finding:
        what = ", ".join(f"{k} is {v}" for k, v in bad.items())
        if self.train_finite:
            since = "from the first evaluation" if index == 1 else f"first at evaluation {index}"
            return self.finding(
                # a warning, not a note: the weights may be sound, but every decision the run makes from its
                # evaluation (the best checkpoint, early stopping, the LR on a plateau) now reads a NaN
                step=step, cause="eval-only",
                summary=f"evaluation loss {what} at step {step} ({since}) while the {self.train_finite} training "
                        "losses so far are finite: the evaluation's arithmetic, not the training (a metric broken "
                        "from the start, or an evaluation in which the model predicted nothing); what is chosen "
                        "from the evaluation (best checkpoint, early stopping) reads a NaN",
                fix="if it lasts, evaluate that checkpoint on the validation batches alone: check for an empty "
                    "prediction or target set, log(0), fp16/AMP overflow in the validation loss",
                evidence={"values": {k: str(v) for k, v in bad.items()}, "evaluation": index,
                          "finite_training_losses": self.train_finite, "detected_step": step},
            )
        return self.finding(
            step=step, cause="eval",
            summary=f"evaluation loss {what} at step {step} (the first non-finite evaluation loss of the run)",
            fix="evaluate the checkpoint of that step on the validation batches alone; check for log(0), an empty "
                "target set, fp16/AMP overflow in the loss or the model's head",
            evidence={"values": {k: str(v) for k, v in bad.items()}, "detected_step": step},
        )

    def on_step(self, row: dict[str, Any]) -> list[Finding] | None:
        step = row["step"]
        bad: dict[str, Any] = {}
        if _nonfinite(row.get("loss")):
            bad["loss"] = row["loss"]
        zeroed: dict[str, float] = {}
        together = 0  # parts at exactly 0 at this step that were above 0 before
        for name, value in (row.get("parts") or {}).items():
            if _nonfinite(value):
                bad[f"part {name}"] = value
                continue
            hist = self.part_hist.setdefault(name, collections.deque(maxlen=20))
            together += value == 0 and bool(hist) and median(list(hist)) > 0
            # (printed to a few decimals, `conf_loss: 0.0` of YOLOX's `{:.1f}`, a small value rounds to 0: a
            # clamp is claimed only ten print steps above it)
            if value == 0 and len(hist) >= 10 and min(hist) > 0 \
                    and median(list(hist)) > max(1e-3, 10 * _print_step(hist)):
                zeroed[name] = median(list(hist))
                continue  # the clamped zero stays out of the history it is judged against
            if finite(value):
                hist.append(value)
        if zeroed and together >= 2 and finite(row.get("loss")):
            # several parts at exactly 0 together beside a finite loss: a batch without one positive target (a
            # detector's box, IoU and class losses are computed over foreground matches only: YOLOX, YOLO,
            # DETR-style matchers), not a clamped NaN, which zeroes the one part that overflowed
            zeroed = {}
        if not bad and not self.hits and finite(row.get("loss")):
            self.train_finite += 1
        out: list[Finding] = []
        if self.pending is not None and (bad or self.train_finite):
            out.append(self.end())  # type: ignore[arg-type]  # pending: end() gives its finding
        first = None
        if not self.hits and bad:
            what = ", ".join(f"{k} is {v}" for k, v in bad.items())
            batch = (row.get("extra") or {}).get("nonfinite_batch")
            saved = f"; its batch is saved in {Path(batch).name}" if batch and not batch.startswith("not ") else ""
            first = self.finding(
                step=step, summary=f"{what} at step {step} (the first non-finite loss of the run){saved}",
                fix="look at this step's batch; check for log(0), division by a zero count, fp16 overflow",
                evidence={"values": {k: str(v) for k, v in bad.items()}, "parts": row.get("parts"),
                          "batch": (row.get("extra") or {}).get("nonfinite_batch"), "detected_step": step},
            )
        elif not self.hits and zeroed:
            name, med = next(iter(zeroed.items()))
            first = self.finding(
                step=step, cause="zeroed",
                summary=f"loss part {name} is 0 exactly at step {step} while its median over the previous 20 "
                        f"steps is {fmt(med)}: a non-finite value clamped to zero?",
                fix="report the raw value to guard.step and fix the cause (the batch of this step) instead of "
                    "clamping it",
                evidence={"part": name, "value": 0.0, "recent_median": med, "detected_step": step},
            )
        return out + (self._count(row, bool(bad or zeroed), first) or [])


def _print_step(values: collections.abc.Iterable[float]) -> float:
    """The finest decimal step the values show (0.1 for `0.2, 0.3`; 1e-4 for `0.2473`): a print's resolution,
    when they were printed to a fixed number of decimals; ~0 for computed floats."""
    places = 0
    for v in values:
        text = repr(float(v))
        if "e" in text or "E" in text:
            return 0.0
        places = max(places, len(text.split(".")[1].rstrip("0")) if "." in text else 0)
    return 10.0 ** -places if places < 12 else 0.0


class NonfiniteGrad(_RateRule):
    """TG302 nonfinite-grad: a NaN or inf gradient norm while the loss is finite (or not reported).

    ## What it detects
    A sampled optimizer step (the probe measures the total gradient norm on the first `stats_every`
    steps and every `stats_every` after) whose gradient norm is NaN or inf although the loss is
    finite. The first occurrence is a warning; above 1% of the sampled steps, an error. Steps the AMP
    GradScaler skips are not counted: skipping them is its job (see `grad-scaler-collapse`).

    ## Why it matters
    The optimizer writes that NaN into the weights; from the next step on every loss is NaN. A finite
    loss with a non-finite gradient points at the backward pass: a sqrt or norm of zero, a custom
    autograd function, an overflow in a low-precision matmul.

    ## Example
    `TG302 nonfinite-grad [warning] at step 120: the gradient norm is nan at step 120 while the loss is
    2.31`

    ## What to change
    Clip gradients (clipping does not fix NaN, but `torch.nn.utils.clip_grad_norm_(...,
    error_if_nonfinite=True)` stops at the first); look for sqrt/norm/div of values that can be zero;
    run with `torch.autograd.set_detect_anomaly(True)` on the step's batch.

    ## Known false positives
    None known outside AMP, which is excluded.

    ## Options
    `trainguard.watch(stats_every=N)` sets how often the gradient norm is sampled.
    """

    code, name, severity = "TG302", "nonfinite-grad", "warning"
    needs = (GRAD_NORM,)
    what = "non-finite gradient norms"

    def on_step(self, row: dict[str, Any]) -> list[Finding] | None:
        gn = row.get("grad_norm")
        if gn is None:
            return None
        if _nonfinite(row.get("loss")):
            self.steps += 1  # the loss's own rule speaks for this step
            return None
        hit = _nonfinite(gn)
        first = None
        if hit and not self.hits:
            first = self.finding(
                step=row["step"],
                summary=(f"the gradient norm is {gn} at step {row['step']} while the loss is {fmt(row.get('loss'))}"
                         if row.get("loss") is not None else
                         f"the gradient norm is {gn} at step {row['step']} (the loss of this step was not reported,"
                         " so the backward pass cannot be told apart from a non-finite loss)"),
                fix="look for sqrt/norm/division of values that can be zero in the backward; clip with "
                    "error_if_nonfinite=True; replay the step's batch under set_detect_anomaly",
                evidence={"grad_norm": str(gn), "loss": row.get("loss"), "detected_step": row["step"]},
            )
        return self._count(row, hit, first)


class GradScalerCollapse(Rule):
    """TG303 grad-scaler-collapse: an AMP loss scale that keeps falling (optimizer steps being skipped).

    ## What it detects
    The GradScaler's loss scale (read by the probe without a sync) falling below 1, or falling at
    half or more of the last 50 steps after the first 50 (each fall is a skipped optimizer step). The
    usual calibration at the start (a few halvings from 65536) does not count.

    ## Why it matters
    Each fall means the gradients overflowed in fp16 and the optimizer step was skipped: the run burns
    compute and learns nothing, while its loss curve looks merely flat. A scale below 1 means the
    gradients overflow even unscaled: something produces inf or NaN every step.

    ## Example
    `TG303 grad-scaler-collapse [error] at step 1: the AMP loss scale fell 17 times in 17 steps, from
    6.55e+04 to 0.5: optimizer steps are being skipped`

    ## What to change
    Find the overflow (a loss computed in fp16, an activation without a norm, an LR too high); use
    bf16 where the hardware has it; lower the LR.

    ## Known false positives
    None known.

    ## Options
    None.
    """

    code, name, severity = "TG303", "grad-scaler-collapse", "error"
    needs = (LOSS_SCALE,)

    def __init__(self, plan: dict[str, Any]) -> None:
        super().__init__(plan)
        self.prev: float | None = None
        self.peak = 0.0
        self.falls: collections.deque[int] = collections.deque(maxlen=50)
        self.n = 0
        self.total_falls = 0
        self.first_fall: int | None = None

    def on_step(self, row: dict[str, Any]) -> Finding | None:
        scale = row.get("loss_scale")
        if not finite(scale):
            return None
        self.n += 1
        self.peak = max(self.peak, scale)
        fell = self.prev is not None and scale < self.prev
        self.prev = scale
        self.falls.append(1 if fell else 0)
        if fell:
            self.total_falls += 1
            if self.first_fall is None:
                self.first_fall = row["step"]
        collapsed = scale < 1 or (self.n > 50 and sum(self.falls) >= 25)
        if not collapsed:
            return None
        return self.finding(
            step=self.first_fall or row["step"],
            summary=f"the AMP loss scale fell {self.total_falls} times in {self.n} steps, from {fmt(self.peak)} to "
                    f"{fmt(scale)}: optimizer steps are being skipped",
            fix="find the fp16 overflow (a loss or activation computed in fp16, an LR too high); prefer bf16",
            evidence={"loss_scale": scale, "peak_scale": self.peak, "falls": self.total_falls, "steps": self.n,
                      "falls_last_50": sum(self.falls), "detected_step": row["step"]},
        )


class ClipBeforeUnscale(Rule):
    """TG304 clip-before-unscale: gradients clipped while still multiplied by the GradScaler's scale.

    ## What it detects
    Five sampled optimizer steps in a row at which the gradient norm the optimizer receives, times the
    loss scale, is one and the same round number (to 1e-4, two significant digits: 1.0, 0.5, 5) while
    the norm itself is a hundredth of it or less and the scale is 256 or more. That is the signature of
    `clip_grad_norm_(params, max_norm)` called on scaled gradients: it clips them to `max_norm`, and
    `scaler.step` then divides them by the scale, so every step's gradient norm is pinned at
    `max_norm / scale`. The scale is read from the GradScaler stepping the optimizer (passed to
    `watch(scaler=...)` or found on the stack of its `step`).

    ## Why it matters
    Every update is `scale` times (65,536 at the start) smaller than meant: with SGD the run barely
    learns, with Adam only its epsilon notices; the loss curve is "very flat" and nothing fails
    (Lightning-AI/pytorch-lightning#9599, milesial/Pytorch-UNet#468).

    ## Example
    `TG304 clip-before-unscale [error] at step 1: the gradient norm is 1.53e-05 at 5 sampled steps in a
    row (steps 1-5), exactly 1 / the loss scale 65,536: the gradients were clipped to max_norm 1 while
    still scaled`

    ## What to change
    Call `scaler.unscale_(optimizer)` right before `torch.nn.utils.clip_grad_norm_(...)`, then
    `scaler.step(optimizer)` and `scaler.update()`.

    ## Known false positives
    None known: an unscaled gradient norm equal to a round number divided by the scale at five steps in a
    row does not happen by chance.

    ## Options
    None.
    """

    code, name, severity = "TG304", "clip-before-unscale", "error"
    needs = (GRAD_NORM, LOSS_SCALE)
    ROWS = 5

    def __init__(self, plan: dict[str, Any]) -> None:
        super().__init__(plan)
        self.pinned: collections.deque[tuple[int, float, float]] = collections.deque(maxlen=self.ROWS)
        self.done = False

    def on_step(self, row: dict[str, Any]) -> Finding | None:
        gn, scale = row.get("grad_norm"), row.get("loss_scale")
        if self.done or not finite(gn) or not finite(scale):
            return None
        if scale < 256 or gn <= 0:
            self.pinned.clear()
            return None
        self.pinned.append((row["step"], float(gn), float(scale)))
        if len(self.pinned) < self.ROWS:
            return None
        products = [g * s for _, g, s in self.pinned]
        level = median(products)
        if max(products) - min(products) > 1e-4 * level or max(g for _, g, _ in self.pinned) > level / 100:
            return None
        rounded = float(f"{level:.2g}")
        if abs(level - rounded) > 1e-4 * level:
            return None  # pinned, but not at a round max_norm: not this signature
        self.done = True
        first, last = self.pinned[0], self.pinned[-1]
        scales = sorted({s for _, _, s in self.pinned})
        return self.finding(
            step=first[0], cause=self.name,
            summary=f"the gradient norm is {fmt(last[1])} at {self.ROWS} sampled steps in a row (steps {first[0]}-"
                    f"{last[0]}), exactly {fmt(rounded)} / the loss scale {'/'.join(fmt(int(s)) for s in scales)}: the "
                    f"gradients were clipped to max_norm {fmt(rounded)} while still scaled, so every update is "
                    f"{fmt(int(last[2]))}x smaller than meant",
            fix="call scaler.unscale_(optimizer) right before torch.nn.utils.clip_grad_norm_(...), then "
                "scaler.step(optimizer) and scaler.update()",
            evidence={"grad_norms": [g for _, g, _ in self.pinned], "loss_scales": [s for _, _, s in self.pinned],
                      "max_norm": rounded, "steps": [s for s, _, _ in self.pinned], "detected_step": row["step"]},
        )
