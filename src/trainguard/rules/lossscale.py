"""TG205: a loss whose scale is not what the task implies (summed, weighted, or blown up at the start)."""

from __future__ import annotations

import collections
import math
from typing import Any

from trainguard.findings import LOSS, Finding
from trainguard.rules.rule import Rule, finite, fmt
from trainguard.rules.schedule import step_lr

# No classifier or language model has more than a million outputs (the largest vocabularies are ~256k):
# a mean cross-entropy whose class count is unknown is bounded by a uniform guess over a million.
MOST_CLASSES = 1_000_000
OFF = 3.0  # a start more than this many times the uniform guess's loss ...
OFF_BY = 2.0  # ... and more than this above it (nats)
WARMUP = 10.0  # a first row whose LR is 1/10 of a later one's is still in warm-up: its loss is the init's
ABOVE_EVAL = 4.0  # training loss this many times the evaluation loss of the same objective ...
ABOVE_EVAL_BY = 1.0  # ... and this far above it (nats)
PAIRS = 3  # ... at each of the last this-many evaluations


class InitialLossOff(Rule):
    """TG205 initial-loss-off: the losses are far above what the task implies.

    ## What it detects
    Three measures of what a loss should be, each where the run shows it:

    - **the model's output size** (the probe reads `out_features` of a Linear that is the model's last
      layer, or `vocab_size`/`num_classes`/`num_labels` in the config given to `trainguard.watch`): a
      freshly initialised classifier or language model starts near ln(output size), the loss of a
      uniform guess. It fires when the lowest of the first three losses is more than 3x that and more
      than 2 above it (the lowest: the first is computed before any update, and an LR far too high sends
      the next two up, which is `loss-diverged`'s to say, not a sign of the initialisation);
    - **a mean cross-entropy the log's format declares** (cause `cross-entropy-part`; the format's
      contract in `trainguard/ingest/formats/` names the fields: detectron2's `loss_cls` and
      `loss_rpn_cls`, MMDetection's, timm's, nanoGPT's and llm.c's loss): the same test against ln of
      the field's class count (2 for an objectness or other binary cross-entropy), or, with the count
      unknown, ln of a million outputs (13.8), above which no mean cross-entropy starts. A first row
      logged while the LR is still a tenth or less of what it reaches later (warm-up) is judged by
      itself: updates that small cannot have raised it;
    - **the evaluation loss of the same objective** (cause `above-eval`; formats whose evaluation
      computes the training loss's own function, the Hugging Face Trainer's `loss` and `eval_loss`): the
      training loss at least 4x the evaluation loss and 1 above it at each of the last three
      evaluations.

    ## Why it matters
    A loss far above ln(V) means the loss is not what it seems: summed instead of averaged, multiplied
    by a weight, mixed with other terms of another scale, or logits blown up by the initialisation.
    Seed 002 started at 101.4 where ln(49152) = 10.8. A training loss that stays a fixed multiple of the
    evaluation loss is a logged loss scaled by something the evaluation does not do: the Hugging Face
    Trainer 4.46-4.47 logged the loss multiplied by the gradient-accumulation steps
    (huggingface/transformers#35204), a model without `num_items_in_batch` support divides by one
    micro-batch's tokens only (huggingface/transformers#37766); a custom `compute_loss` that sums.

    ## Example
    `TG205 initial-loss-off [warning] at step 1: the first losses are 101 or more (the lowest of 3), 9.4x ln(49,152)
    = 10.8, the loss of a uniform guess over the model's 49,152 outputs`

    ## What to change
    Check the reduction (`mean`, not `sum`), the weights of the loss parts, and the scale of the
    output layer's initialisation; for a training loss that is a multiple of the evaluation loss,
    the logging's scaling (gradient accumulation: upgrade transformers past 4.47, or divide by the
    accumulation steps where the loss is logged).

    ## Known false positives
    Models whose last linear layer is not the output (regression heads with several outputs, models
    that register the output layer before others); losses that are not cross-entropy. A training
    loss that adds terms the evaluation leaves out (a distillation term computed only in training)
    is several times the evaluation loss by design.

    ## Options
    Pass `config={"vocab_size": V}` (or `num_classes`) to `trainguard.watch` to state the output size.
    """

    code, name, severity = "TG205", "initial-loss-off", "warning"
    needs = (LOSS,)

    def __init__(self, plan: dict[str, Any]) -> None:
        super().__init__(plan)
        size = plan.get("output_size")
        self.size = int(size) if finite(size) and size >= 2 else None
        # field -> its class count (0: unknown), from the format's contract
        declared = plan.get("cross_entropy") or {}
        self.ce_fields: dict[str, int] = {str(k): int(v) for k, v in dict(declared).items()
                                          if isinstance(v, int) and not isinstance(v, bool) and v >= 0}
        self.same_objective = bool(plan.get("eval_same_loss"))
        self.first: list[tuple[int, float]] = []
        self.ce_first: dict[str, list[tuple[int, float, float | None]]] = {}  # field -> (step, value, lr)
        self.peak_lr: float | None = None
        self.said = False
        self.last_loss: tuple[int, float] | None = None
        self.pairs: collections.deque[tuple[int, float, float]] = collections.deque(maxlen=PAIRS)
        self.first_pair: tuple[int, float, float] | None = None
        self.evals = 0

    # -- the model's output size -------------------------------------------------------------------

    def on_step(self, row: dict[str, Any]) -> Finding | None:
        loss, step = row.get("loss"), row["step"]
        lr = step_lr(row)
        if finite(lr) and (self.peak_lr is None or lr > self.peak_lr):
            self.peak_lr = float(lr)
        if finite(loss):
            self.last_loss = (step, float(loss))
        if self.said:
            return None
        for name, value in self._ce_values(row):
            got = self.ce_first.setdefault(name, [])
            if len(got) < 3:
                got.append((step, value, float(lr) if finite(lr) else None))
        if self.size is not None and len(self.first) < 3 and finite(loss):
            self.first.append((step, float(loss)))
            if len(self.first) == 3:
                return self._output_size_finding(step)
        return None

    def _output_size_finding(self, step: int) -> Finding | None:
        assert self.size is not None
        start = min(v for _, v in self.first)
        expected = math.log(self.size)
        if start <= OFF * expected or start - expected <= OFF_BY:
            return None
        self.said = True
        return self.finding(
            step=self.first[0][0],
            summary=f"the first losses are {fmt(start)} or more (the lowest of 3), {start / expected:.1f}x ln({fmt(self.size)}) "
                    f"= {fmt(expected)}, the loss of a uniform guess over the model's {fmt(self.size)} outputs",
            fix="check the loss reduction (mean, not sum), the weights of loss parts, and the output layer's init",
            evidence={"first_losses": [v for _, v in self.first], "output_size": self.size,
                      "expected": expected, "ratio": start / expected, "detected_step": step},
        )

    def _ce_values(self, row: dict[str, Any]) -> list[tuple[str, float]]:
        if not self.ce_fields:
            return []
        parts = row.get("parts") or {}
        out = []
        for name in self.ce_fields:
            value = row.get("loss") if name == "loss" else parts.get(name)
            if finite(value):
                out.append((name, float(value)))
        return out

    # -- a cross-entropy the format declares ----------------------------------------------------------

    def _ce_finding(self) -> Finding | None:
        found = [f for f in (self._ce_field_finding(n, rows) for n, rows in self.ce_first.items() if rows) if f]
        if not found:
            return None
        self.said = True
        return max(found, key=lambda f: f.evidence["ratio"])  # the field furthest off says it best

    def _ce_field_finding(self, name: str, rows: list[tuple[int, float, float | None]]) -> Finding | None:
        classes = self.ce_fields[name]
        bound = math.log(classes) if classes >= 2 else math.log(MOST_CLASSES)
        step0, first, lr0 = rows[0]
        in_warmup = lr0 is not None and self.peak_lr is not None and lr0 * WARMUP <= self.peak_lr
        start = first if in_warmup else min(v for _, v, _ in rows)
        if start <= OFF * bound or start - bound <= OFF_BY:
            return None
        which = (f"its first value {fmt(first)} (step {step0}, in the warm-up: LR {fmt(lr0)}, "
                 f"{fmt(self.peak_lr)} later)" if in_warmup
                 else f"its first values are {fmt(start)} or more (the lowest of {len(rows)})")
        against = (f"ln({fmt(classes)}) = {fmt(bound)}, a uniform guess over its {fmt(classes)} classes"
                   if classes >= 2 else f"ln({fmt(MOST_CLASSES)}) = {fmt(bound)}, a uniform guess over a "
                                        "million classes, more than any task has")
        return self.finding(
            step=step0, cause="cross-entropy-part",
            summary=f"{name}, a mean cross-entropy by its format, starts far above any uniform guess: "
                    f"{which}, {start / bound:.1f}x {against}",
            fix="the model starts broken: check the labels (class ids within the classifier's range, the "
                "number of classes the head is built for), the output layer's initialisation, and a "
                "checkpoint that loaded into the wrong head; then the loss reduction (mean, not sum)",
            evidence={"field": name, "first_values": [v for _, v, _ in rows], "first_lr": lr0,
                      "peak_lr": self.peak_lr, "classes": classes or None, "bound": bound,
                      "ratio": start / bound},
        )

    # -- the evaluation loss of the same objective ----------------------------------------------------

    def on_event(self, event: dict[str, Any]) -> None:
        if not self.same_objective or event.get("kind") != "eval" or self.last_loss is None:
            return
        value = (event.get("data") or {}).get("loss")
        step = event.get("step")
        if not finite(value) or not isinstance(step, int) or value <= 0:
            return
        at, train = self.last_loss
        interval = self.plan.get("logging_steps")
        if step - at > (interval if isinstance(interval, int) and interval > 0 else 0):
            return  # no training loss logged for the evaluation's step: nothing to pair it with
        pair = (step, train, float(value))
        self.pairs.append(pair)
        self.first_pair = self.first_pair or pair
        self.evals += 1

    def _eval_finding(self) -> Finding | None:
        pairs = list(self.pairs)
        if len(pairs) < PAIRS or any(t < ABOVE_EVAL * e or t - e < ABOVE_EVAL_BY for _, t, e in pairs):
            return None
        first = self.first_pair or pairs[0]
        ratios = [t / e for _, t, e in pairs]
        self.said = True
        return self.finding(
            step=first[0], cause="above-eval",
            summary=f"the training loss is {min(ratios):.1f}-{max(ratios):.1f}x the evaluation loss of the same "
                    f"objective at the last {len(pairs)} evaluations ({fmt(pairs[-1][1])} against "
                    f"{fmt(pairs[-1][2])} at step {pairs[-1][0]}; {fmt(first[1])} against {fmt(first[2])} at "
                    f"step {first[0]}): the logged training loss is scaled by something the evaluation does not "
                    "do",
            fix="find what multiplies the training loss where it is logged: gradient accumulation (transformers "
                "4.46-4.47 logged the loss times the accumulation steps: upgrade; a model without "
                "num_items_in_batch support: pass it or divide), a custom compute_loss that sums instead of "
                "averaging, or a term added only in training",
            evidence={"pairs": [{"step": s, "train": t, "eval": e} for s, t, e in pairs],
                      "first_pair": {"step": first[0], "train": first[1], "eval": first[2]},
                      "evaluations": self.evals, "ratios": ratios},
        )

    def end(self) -> Finding | None:
        if self.said:
            return None
        return self._ce_finding() or self._eval_finding()
