"""TG4xx: multi-part losses. Parts of very different size, parts that vanish, parts that do not add up,
and curriculum weights that never ramp. The loop reports them with
`guard.step(loss, parts={"kd": kd, "lm": lm}, weights={"kd": 0.7, "lm": 0.3})`.
"""

from __future__ import annotations

import collections
from typing import Any

from trainguard.findings import PARTS, WEIGHTS, Finding
from trainguard.rules.rule import Rule, Streak, finite, fmt, median

WINDOW = 20  # steps a composition rule looks at before it is sure (fewer in a short run, see below)


def _weight(row: dict[str, Any], name: str) -> float:
    w = (row.get("weights") or {}).get(name)
    return float(w) if finite(w) else 1.0


class LossPartsImbalanced(Rule):
    """TG401 loss-parts-imbalanced: named loss parts whose weighted sizes differ by more than 100x.

    ## What it detects
    Over the last 20 steps (2.5% of a shorter run, at least 5), the median of |weight x part| for each
    reported part; the rule fires when the largest is more than 100x the smallest. Parts whose weight is still changing (a curriculum
    ramp) wait until it settles; parts at exactly zero belong to `loss-part-vanished`.

    ## Why it matters
    The gradient follows the largest term. A part 100x smaller than another contributes nothing the
    optimizer can notice: it is in the loss only on paper. Seed 004 had a feature loss of 150-200
    beside a KD loss of 4 and a load-balance loss of 0.0001.

    ## Example
    `TG401 loss-parts-imbalanced [warning] at step 1: weighted loss parts differ by 1.75e+06x over the
    last 20 steps: feature 175, kd 4.02, balance 0.0001`

    ## What to change
    Normalise each part (mean over elements, not sum), then set weights so the weighted parts are of
    the same order at the start of the run; or drop the part that cannot matter.

    ## Known false positives
    A part that is meant to be a small regulariser (weight decay written as a loss, a tiny entropy
    bonus) and is known to be tiny.

    ## Options
    None.
    """

    code, name, severity = "TG401", "loss-parts-imbalanced", "warning"
    needs = (PARTS,)
    RATIO = 100.0

    def __init__(self, plan: dict[str, Any]) -> None:
        super().__init__(plan)
        self.mags: dict[str, collections.deque[float]] = {}
        self.weights: dict[str, collections.deque[float]] = {}
        self.first_step: int | None = None
        self.n = 0
        # 20 steps, or 2.5% of a short run (at least 5): a 100x gap needs no long look
        self.w = self.window(0.025, 5, WINDOW)

    def on_step(self, row: dict[str, Any]) -> Finding | None:
        parts = row.get("parts") or {}
        if len(parts) < 2:
            return None
        self.n += 1
        if self.first_step is None:
            self.first_step = row["step"]
        for name, value in parts.items():
            if not finite(value):
                continue
            w = _weight(row, name)
            self.mags.setdefault(name, collections.deque(maxlen=self.w)).append(abs(w * value))
            self.weights.setdefault(name, collections.deque(maxlen=self.w)).append(w)
        if self.n < self.w or self.n % min(5, self.w):
            return None
        sizes = {}
        for name, mags in self.mags.items():
            ws = self.weights[name]
            if len(mags) < self.w or max(ws) - min(ws) > 1e-9 * max(1.0, abs(max(ws))):
                continue  # too few reports, or a weight still on its schedule
            size = median(list(mags))
            if size > 1e-12:
                sizes[name] = size
        if len(sizes) < 2:
            return None
        big, small = max(sizes, key=sizes.__getitem__), min(sizes, key=sizes.__getitem__)
        ratio = sizes[big] / sizes[small]
        if ratio <= self.RATIO:
            return None
        listing = ", ".join(f"{k} {fmt(v)}" for k, v in sorted(sizes.items(), key=lambda kv: -kv[1]))
        return self.finding(
            step=self.first_step,
            summary=f"weighted loss parts differ by {fmt(ratio)}x over the last {self.w} steps: {listing}",
            fix=f"normalise each part (mean, not sum) and set weights so weighted parts are of one order; "
                f"{small} cannot move the gradient beside {big}",
            evidence={"weighted_medians": sizes, "largest": big, "smallest": small, "ratio": ratio,
                      "weights": {k: self.weights[k][-1] for k in sizes}, "detected_step": row["step"]},
        )


class LossPartVanished(Rule):
    """TG402 loss-part-vanished: a loss part that was reported and then disappears or sits at exactly zero.

    ## What it detects
    A part reported with a non-zero value that is then missing from the parts of at least 10
    consecutive steps (or 3x the longest gap between its reports so far) while other parts are still
    reported; or that reads exactly 0.0 for as many steps in a row.

    ## Why it matters
    The part stopped contributing, usually through a bug in a branch: a condition that is true only
    at step 0, a mask that became empty, a key renamed. Seed 004's LM loss vanished after step 0 and
    nobody noticed for the whole run.

    ## Example
    `TG402 loss-part-vanished [warning] at step 2: loss part lm was reported (last 3.41 at step 1) and is
    missing from the 10 steps since`

    ## What to change
    Find where the part is computed and why it stops (a condition on the step, an empty mask, an
    early return); if it is meant to switch off, give it a weight of 0 instead of dropping it.

    ## Known false positives
    A hinge or margin loss that is legitimately exactly zero once its margin is met; a part that is
    switched off by design.

    ## Options
    None.
    """

    code, name, severity = "TG402", "loss-part-vanished", "warning"
    needs = (PARTS,)

    def __init__(self, plan: dict[str, Any]) -> None:
        super().__init__(plan)
        self.last: dict[str, tuple[int, float]] = {}  # last non-zero report: step, value
        self.gap: dict[str, int] = {}
        # per part, the steps in a row it was missing from, and those it read exactly 0 (count and head)
        self.missing: dict[str, Streak] = {}
        self.zeros: dict[str, Streak] = {}
        self.none = Streak()  # stands for a part with no streak

    def on_step(self, row: dict[str, Any]) -> Finding | None:
        parts = row.get("parts") or {}
        if not parts:
            return None  # a step without any parts says nothing about one part
        step = row["step"]
        for name, value in parts.items():
            gone = self.missing.get(name)
            if gone is None:
                gone = self.missing[name] = Streak()
            elif gone.count:
                if name in self.last:
                    self.gap[name] = max(self.gap.get(name, 1), gone.count + 1)
                gone.clear()
            if finite(value) and value == 0:
                if name in self.last:
                    self.zeros.setdefault(name, Streak()).add(step)
            elif finite(value):
                self.last[name] = (step, value)
                if name in self.zeros:
                    self.zeros[name].clear()
        for name in self.last:
            if name not in parts:
                self.missing.setdefault(name, Streak()).add(step)
        for name, (seen, value) in self.last.items():
            need = max(10, 3 * self.gap.get(name, 1))
            gone, zero = self.missing.get(name, self.none), self.zeros.get(name, self.none)
            if gone.count >= need:
                return self._found(name, seen, value, gone, "missing from", row)
            if zero.count >= need:
                return self._found(name, seen, value, zero, "exactly 0 at", row)
        return None

    def _found(self, name: str, seen: int, value: float, steps: Streak, how: str, row: dict) -> Finding:
        return self.finding(
            step=steps.steps[0],
            summary=f"loss part {name} was reported (last {fmt(value)} at step {seen}) and is {how} the "
                    f"{steps.count} steps since",
            fix="find why the part stops (a condition on the step, an empty mask, a renamed key); to switch a "
                "part off on purpose give it weight 0",
            evidence={"part": name, "last_value": value, "last_step": seen, "steps": list(steps.steps),
                      "detected_step": row["step"]},
            cause="zero" if how.startswith("exactly") else "missing",
        )


class LossPartsDontSum(Rule):
    """TG403 loss-parts-dont-sum: the parts (times their weights) do not add up to the total loss.

    ## What it detects
    With two or more parts reported, the total loss compared with the sum of weight x part (weight 1
    when none is reported) and with the mean of the parts. When neither matches within 2% for 10
    steps in a row, the rule fires.

    ## Why it matters
    What is logged is not what is optimised: a weight that is reported but never applied, a part
    added twice, a term missing from the logs. Decisions taken from the logged parts (tuning a weight,
    reading a curriculum) are then taken on fiction.

    ## Example
    `TG403 loss-parts-dont-sum [warning] at step 1: the total loss is 5.13 but weight x part adds up
    to 2.43 (kd 1 x 2.05, feature 0.1 x 3.08)`

    ## What to change
    Compute the total from the same weighted parts you report: `total = sum(w[k] * parts[k])`.

    ## Known false positives
    Parts that are deliberately a subset of the total (an unreported regulariser).

    ## Options
    None.
    """

    code, name, severity = "TG403", "loss-parts-dont-sum", "warning"
    needs = (PARTS,)
    TOL = 0.02

    def __init__(self, plan: dict[str, Any]) -> None:
        super().__init__(plan)
        self.bad = Streak(keep=10)  # steps in a row whose parts did not add up

    def on_step(self, row: dict[str, Any]) -> Finding | None:
        reported = row.get("parts")
        if not reported or len(reported) < 2:
            return None  # most runs report no parts: decided before building anything
        parts = {k: v for k, v in reported.items() if finite(v)}
        loss = row.get("loss")
        if len(parts) < 2 or not finite(loss):
            return None
        weighted = sum(_weight(row, k) * v for k, v in parts.items())
        mean = sum(parts.values()) / len(parts)
        scale = max(abs(loss), sum(abs(_weight(row, k) * v) for k, v in parts.items()))
        tol = self.TOL * scale + 1e-6
        if abs(loss - weighted) <= tol or abs(loss - mean) <= tol:
            self.bad.clear()
            return None
        self.bad.add(row["step"])
        if self.bad.count < 10:
            return None
        terms = ", ".join(f"{k} {fmt(_weight(row, k))} x {fmt(v)}" for k, v in parts.items())
        return self.finding(
            step=self.bad.steps[0],
            summary=f"the total loss is {fmt(loss)} but weight x part adds up to {fmt(weighted)} ({terms})",
            fix="compute the total from the same weighted parts you report: total = sum(w[k] * parts[k])",
            evidence={"loss": loss, "weighted_sum": weighted, "parts": parts,
                      "weights": {k: _weight(row, k) for k in parts}, "steps": list(self.bad.steps),
                      "detected_step": row["step"]},
        )


class LossWeightStalled(Rule):
    """TG404 loss-weight-stalled: a scheduled loss weight still near zero far into the run.

    ## What it detects
    A weight reported with `guard.step(..., weights={...})` that changes over the run (it is on a
    schedule) and, a quarter or more into the planned run, is still rising and has never been above
    10% of the largest weight in the loss. Needs `total_steps`.

    ## Why it matters
    A curriculum that ramps a part in over a horizon much longer than the run (sized in micro-batches,
    or for another run length) never gives that part its say. Seed 004's curriculum weight was 6.7% at
    half-way: its part had barely been trained when the run ended.

    ## Example
    `TG404 loss-weight-stalled [warning] at step 250: weight lm is 0.0334 at step 250, 25% into the
    planned 1,000 steps, and still ramping (largest weight: kd 1)`

    ## What to change
    Size the ramp in optimizer steps of this run (a fraction of `total_steps`), and check it with the
    plan in the log at start-up.

    ## Known false positives
    A weight meant to ramp slowly over the whole run to a small target.

    ## Options
    None.
    """

    code, name, severity = "TG404", "loss-weight-stalled", "warning"
    needs = (WEIGHTS,)

    def __init__(self, plan: dict[str, Any]) -> None:
        super().__init__(plan)
        self.first: dict[str, float] = {}
        self.peak: dict[str, float] = {}
        self.recent: dict[str, collections.deque[float]] = {}

    def on_step(self, row: dict[str, Any]) -> Finding | None:
        weights = {k: float(v) for k, v in (row.get("weights") or {}).items() if finite(v)}
        if not weights:
            return None
        for k, w in weights.items():
            self.first.setdefault(k, w)
            self.peak[k] = max(self.peak.get(k, w), w)
            self.recent.setdefault(k, collections.deque(maxlen=WINDOW)).append(w)
        frac = self.fraction(row["step"])
        if frac is None or frac < 0.25:
            return None
        largest = max(weights.values())
        top = max(weights, key=weights.__getitem__)
        for k, w in weights.items():
            hist = self.recent[k]
            scheduled = self.peak[k] != self.first[k]
            rising = len(hist) >= 2 and hist[-1] > hist[0]
            if scheduled and rising and largest > 0 and self.peak[k] < 0.1 * largest:
                return self.finding(
                    step=row["step"],
                    summary=f"weight {k} is {fmt(w)} at step {row['step']}, {frac:.0%} into the planned "
                            f"{fmt(self.total_steps)} steps, and still ramping (largest weight: {top} {fmt(largest)})",
                    fix="size the ramp in optimizer steps of this run (a fraction of total_steps)",
                    evidence={"weight": k, "value": w, "first": self.first[k], "fraction": frac,
                              "largest": {top: largest}, "detected_step": row["step"]},
                )
        return None
