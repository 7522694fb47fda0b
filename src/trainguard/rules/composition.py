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
    """TG401 loss-parts-imbalanced: named loss parts whose sizes differ by more than 100x, beyond what their weights chose.

    ## What it detects
    Over the last 20 steps (2.5% of a shorter run, at least 5), the median of |weight x part| for each
    reported part, and the gap between the largest and each of the others. A gap over 100x has two
    factors, and the rule looks at both: the weights the run reported (`weights=` in `guard.step`) and
    the parts' own values.

    - A warning when the parts' own values are out of scale: the small part has no reported weight, or
      one within 10x of the large part's (weight 1 is assumed for a part without one); or its weight is
      10x or more below, but the raw parts still differ by more than 100x, and did from the first
      window (a part summed instead of averaged, an unnormalised feature loss beside a regulariser).
    - A note (severity info), not a warning, when the run reported a weight 10x or more below the large
      part's for the small part and the raw parts are within 100x of each other (or drifted apart only
      later): the run made that part small on purpose. PaLM's z-loss (1e-4), a router z-loss (1e-3),
      a router balance loss (0.001-0.02), an entropy bonus (0.01) all look like this.

    Parts whose weight is still changing (a curriculum ramp) wait until it settles; parts at exactly zero
    belong to `loss-part-vanished`.

    ## Why it matters
    The gradient follows the largest term. A part 100x smaller than another at comparable weight
    contributes nothing the optimizer can notice: it is in the loss only on paper, or the large one is
    wrong (a sum over elements where a mean was meant). Seed 004 had a feature loss of 150-200 and an
    attention loss of 90-140 beside a KD loss of 30-40 and a load-balance loss of 0.0001.

    ## Example
    Seed 004's numbers, reported without weights:
    `TG401 loss-parts-imbalanced [warning] at step 1: weighted loss parts differ by 5.77e+05x over the
    last 20 steps: feature 173, attention 115, kd 34.6, balance 3.00e-04`

    An MoE LM whose LM loss is summed over its 256 tokens (scenarios/moe_lm_loss_summed):
    `TG401 loss-parts-imbalanced [warning] at step 1: weighted loss parts differ by 4.85e+05x over the
    last 7 steps: lm 1.28e+03, balance 0.0105 = 0.01 x 1.05, z 0.00303 = 1.00e-04 x 30.3, router_z
    0.00263 = 0.001 x 2.63; the weights put router_z 1e+03x below lm, the parts themselves differ by 485x`

    The same model trained the standard way (scenarios/quiet_moe_lm_regularisers), a note:
    `TG401 loss-parts-imbalanced [info] at step 1: router_z enters the loss 1.94e+03x below lm over the
    last 7 steps (lm 4.99, balance 0.0105 = 0.01 x 1.05, z 0.00303 = 1.00e-04 x 30.3, router_z 0.00257 =
    0.001 x 2.57); its reported weight puts it 1e+03x below, and unweighted the two are within 1.94x of
    each other. A regulariser small by design (...) looks like this; so does a weight mis-set by orders
    of magnitude`

    ## What to change
    Normalise each part (mean over elements, not sum), then set weights so the parts meant to matter are
    of the same order at the start of the run; or drop the part that cannot matter. Report a regulariser
    raw, with its coefficient in `weights=`, so the rule can tell its small weight from a small value.

    ## Known false positives
    A regulariser reported already multiplied by its coefficient, without `weights=`: the rule cannot
    tell it from seed 004's balance term and warns (report the raw part and its weight instead). Where a
    log's format contract says its writer prints every part pre-weighted (detectron2's console), the gap
    is a note (cause `preweighted`), not a warning. A part
    centred on zero by construction (a policy-gradient loss with normalised advantages), whose median
    size says little about its gradient. A log whose parts are windowed medians (detectron2's
    metrics.json) is not judged: their ratio is not what the optimizer weighed. The other way round, a weight mis-set by orders of magnitude
    looks like a regulariser small by design: it gets the note, not a warning.

    ## Options
    None.
    """

    code, name, severity = "TG401", "loss-parts-imbalanced", "warning"
    needs = (PARTS,)
    RATIO = 100.0
    CHOSEN = 10.0  # a reported weight this many times below another's made its part small on purpose

    def __init__(self, plan: dict[str, Any]) -> None:
        super().__init__(plan)
        self.mags: dict[str, collections.deque[float]] = {}
        self.weights: dict[str, collections.deque[float]] = {}
        self.declared: dict[str, bool] = {}  # the last row reported a weight for the part
        self.first_raw: dict[str, float] = {}  # median |part| at the part's first judgement
        self.first_size: dict[str, float] = {}  # median |weight x part| then
        self.first_seen: dict[str, int] = {}  # the step each part was first reported at
        self.n = 0
        self.noted = False
        # 20 steps, or 2.5% of a short run (at least 5): a 100x gap needs no long look
        self.w = self.window(0.025, 5, WINDOW)
        self.steps: collections.deque[int] = collections.deque(maxlen=self.w)
        # the writer prints each part already multiplied by a weight it does not print (detectron2's
        # parts): a small part may be small by that weight, and nothing here can tell which
        self.preweighted = False

    def on_step(self, row: dict[str, Any]) -> Finding | None:
        parts = row.get("parts") or {}
        if len(parts) < 2 or self.plan.get("parts_relation") == "median":
            return None  # each part a median of its own window: their ratio is not what the optimizer weighed
        self.preweighted = self.preweighted or bool((row.get("extra") or {}).get("parts_weighted"))
        self.n += 1
        self.steps.append(row["step"])
        reported = row.get("weights") or {}
        for name, value in parts.items():
            if not finite(value):
                continue
            w = _weight(row, name)
            self.mags.setdefault(name, collections.deque(maxlen=self.w)).append(abs(w * value))
            self.weights.setdefault(name, collections.deque(maxlen=self.w)).append(w)
            self.declared[name] = finite(reported.get(name))
            self.first_seen.setdefault(name, row["step"])
        if self.n < self.w or self.n % min(5, self.w):
            return None
        sizes = {}
        for name, mags in self.mags.items():
            ws = self.weights[name]
            if len(mags) < self.w or not ws[-1] or max(ws) - min(ws) > 1e-9 * max(abs(max(ws)), abs(min(ws))):
                continue  # too few reports, a weight now 0 (out of the loss), or one still on its schedule
            size = median(list(mags))
            if size > 1e-12:
                sizes[name] = size
                self.first_size.setdefault(name, size)
                self.first_raw.setdefault(name, size / abs(ws[-1]))  # a settled weight, not 0 (size > 0)
        if len(sizes) < 2:
            return None
        big = max(sizes, key=sizes.__getitem__)
        found: dict[bool, tuple[float, str]] = {}  # warning? -> (gap, small part) of the widest gap of that kind
        for small, size in sizes.items():
            ratio = sizes[big] / size
            if ratio > self.RATIO:
                warn = self._values_out_of_scale(big, small, ratio)
                if ratio > found.get(warn, (0.0, ""))[0]:
                    found[warn] = (ratio, small)
        if True in found:
            return self._warning(row, sizes, big, found[True][1])
        if False in found and not self.noted:
            self.noted = True
            return self._note(row, sizes, big, found[False][1])
        return None

    def _chosen(self, big: str, small: str) -> float:
        """How many times below `big` the reported weights put `small`."""
        return abs(self.weights[big][-1]) / abs(self.weights[small][-1])

    def _values_out_of_scale(self, big: str, small: str, ratio: float) -> bool:
        """Whether a gap over 100x is the parts' own doing, not the reported weights'."""
        chosen = self._chosen(big, small)
        if self.preweighted and not self.declared.get(small):
            return False  # weighted by the writer, with a weight it does not print: a note, not a warning
        if not (self.declared.get(small) and chosen >= self.CHOSEN):
            return True  # nothing the run reported says `small` is meant to be small
        raw_first = self.first_raw[big] / self.first_raw[small]
        # the weights made the part small on purpose; the values are out of scale only if they are by
        # themselves, and were from the first window (a regulariser that has since pulled its own value
        # down, as a z-loss does, is doing its job)
        return ratio / chosen > self.RATIO and raw_first > self.RATIO

    def _onset(self, big: str, small: str) -> int:
        """Where the gap began: the later of the two parts' first reports if the gap was there at their first
        judgement (a part that first came at step 150 is not dated to step 1), else the window's first step."""
        if self.first_size[big] / self.first_size[small] > self.RATIO:
            return max(self.first_seen[big], self.first_seen[small])
        return self.steps[0]

    def _listing(self, sizes: dict[str, float]) -> str:
        def one(k: str, v: float) -> str:
            w = self.weights[k][-1]
            return f"{k} {fmt(v)}" if w == 1.0 else f"{k} {fmt(v)} = {fmt(w)} x {fmt(v / abs(w))}"
        return ", ".join(one(k, v) for k, v in sorted(sizes.items(), key=lambda kv: -kv[1]))

    def _evidence(self, row: dict[str, Any], sizes: dict[str, float], big: str, small: str) -> dict[str, Any]:
        chosen, ratio = self._chosen(big, small), sizes[big] / sizes[small]
        return {"weighted_medians": sizes, "raw_medians": {k: v / abs(self.weights[k][-1]) for k, v in sizes.items()},
                "weights": {k: self.weights[k][-1] for k in sizes},
                "weights_reported": {k: self.declared.get(k, False) for k in sizes},
                "largest": big, "smallest": small, "ratio": ratio, "weight_ratio": chosen,
                "raw_ratio": ratio / chosen, "raw_ratio_first": self.first_raw[big] / self.first_raw[small],
                "window": self.w, "detected_step": row["step"]}

    def _warning(self, row: dict[str, Any], sizes: dict[str, float], big: str, small: str) -> Finding:
        ratio, chosen = sizes[big] / sizes[small], self._chosen(big, small)
        summary = f"weighted loss parts differ by {fmt(ratio)}x over the last {self.w} steps: {self._listing(sizes)}"
        fix = (f"normalise each part (mean, not sum) and set weights so weighted parts are of one order; "
               f"{small} cannot move the gradient beside {big}")
        if self.declared.get(small) and chosen >= self.CHOSEN:
            summary += (f"; the weights put {small} {fmt(chosen)}x below {big}, the parts themselves differ by "
                        f"{fmt(ratio / chosen)}x")
            fix = (f"the weights explain {fmt(chosen)}x of the gap, the values {fmt(ratio / chosen)}x: look for a part "
                   f"summed instead of averaged or left unnormalised ({big} {fmt(self.first_raw[big])} at first), "
                   "then set the weights")
        elif not self.declared.get(small):
            fix += (f"; if {small} is a regulariser meant to be this small (a z-loss, a router balance loss), "
                    f"report it raw with its coefficient in weights= and the rule judges it by its weight")
        return self.finding(step=self._onset(big, small), summary=summary, fix=fix,
                            evidence=self._evidence(row, sizes, big, small))

    def _note(self, row: dict[str, Any], sizes: dict[str, float], big: str, small: str) -> Finding:
        ratio, chosen = sizes[big] / sizes[small], self._chosen(big, small)
        if self.preweighted and not self.declared.get(small):
            return self.finding(
                step=self._onset(big, small), severity="info", cause="preweighted",
                summary=f"{small} enters the loss {fmt(ratio)}x below {big} over the last {self.w} steps "
                        f"({self._listing(sizes)}); the log prints each part already multiplied by its weight "
                        "and not the weight, so a part small by design cannot be told from one out of scale",
                fix=f"nothing to change if {small} is a light regulariser by its weight in the config; if it is "
                    f"meant to steer training as much as {big}, raise its weight",
                evidence=self._evidence(row, sizes, big, small))
        raw, raw_first = ratio / chosen, self.first_raw[big] / self.first_raw[small]
        if raw <= self.RATIO:
            unweighted = f"unweighted the two are within {fmt(max(raw, 1 / raw))}x of each other"
        else:
            unweighted = f"unweighted they were within {fmt(max(raw_first, 1 / raw_first))}x at first ({fmt(raw)}x now)"
        return self.finding(
            step=self._onset(big, small), severity="info", cause="weighted",
            summary=f"{small} enters the loss {fmt(ratio)}x below {big} over the last {self.w} steps "
                    f"({self._listing(sizes)}); its reported weight puts it {fmt(chosen)}x below, and {unweighted}. "
                    "A regulariser small by design (a z-loss, a router balance loss, an entropy bonus) looks like "
                    "this; so does a weight mis-set by orders of magnitude",
            fix=f"nothing to change if {small} is meant to be a light regulariser; if it is meant to steer "
                f"training as much as {big}, raise its weight (about {fmt(abs(self.weights[small][-1]) * ratio / 10)} "
                f"puts it within 10x of {big})",
            evidence=self._evidence(row, sizes, big, small),
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


def parts_sum(plan: dict[str, Any]) -> bool:
    """Whether the source promises that the total is the (weighted) sum of its parts: the probe's own
    parts do (`guard.step(parts=...)`, no relation stated); a log's only when its format's contract says
    so (`trainguard.ingest.formats`: `parts_relation` in the plan)."""
    return plan.get("parts_relation", "sum") in ("sum", "weighted-sum")


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
    Parts that are deliberately a subset of the total (an unreported regulariser). A log whose format
    promises no sum (detectron2's windowed medians, Keras heads whose `loss_weights` are not written) is
    not judged.

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
        if not parts_sum(self.plan):
            return None  # the writer promises no sum (windowed medians, heads weighted by unwritten weights)
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
