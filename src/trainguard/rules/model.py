"""TG81x: model-specific rules. Mixture-of-experts routing and language-model perplexity.

(TG801-810 are left to the distillation recipe's own rules.)
"""

from __future__ import annotations

import math
from typing import Any

from trainguard.findings import EVAL, EXPERTS, Finding
from trainguard.rules.rule import Rule, Streak, finite, fmt


class ExpertCollapse(Rule):
    """TG811 expert-collapse: MoE routing concentrated on a few experts.

    ## What it detects
    From the per-expert load the loop reports with `guard.experts(load, layer=...)` (tokens per
    expert, or routing probabilities summed over tokens): the share of each expert, the normalised
    entropy of the shares (1 = even, 0 = one expert takes all) and the dead experts (under 1% of an
    even share). Three reports in a row from one layer with entropy under 0.5, or half the experts
    dead, fire the rule.

    ## Why it matters
    A collapsed router trains a dense model with extra parameters that never learn: the capacity you
    pay for is idle. It happens when the load-balancing loss is too weak (seed 004's sat at 0.0001),
    missing from the total, or computed on the wrong tensor.

    ## Example
    `TG811 expert-collapse [warning] at step 10: layer 0 routes 91% of tokens to expert 3; 6 of 8
    experts are dead; routing entropy 0.21 of the maximum`

    ## What to change
    Check the load-balancing loss is in the total with a weight that makes it matter (1e-2 is usual
    for the Switch form); add router z-loss; add noise to the router's logits early on.

    ## Known false positives
    Very early steps of a run whose router starts skewed and is balanced within a few hundred steps.

    ## Options
    None.
    """

    code, name, severity = "TG811", "expert-collapse", "warning"
    needs = (EXPERTS,)

    def __init__(self, plan: dict[str, Any]) -> None:
        super().__init__(plan)
        self.streak: dict[str, Streak] = {}  # per layer: the reports in a row that looked collapsed

    def on_event(self, event: dict[str, Any]) -> Finding | None:
        if event.get("kind") != "experts":
            return None
        data = event.get("data") or {}
        load = [float(v) for v in data.get("load") or [] if finite(v)]
        layer = str(data.get("layer") if data.get("layer") is not None else 0)
        total = sum(load)
        if len(load) < 2 or total <= 0:
            return None
        shares = [max(0.0, v) / total for v in load]
        n = len(shares)
        entropy = max(0.0, -sum(s * math.log(s) for s in shares if s > 0) / math.log(n))  # no "-0.00"
        dead = sum(1 for s in shares if s < 0.01 / n)
        if entropy >= 0.5 and dead < n / 2:
            self.streak.pop(layer, None)
            return None
        streak = self.streak.setdefault(layer, Streak())
        streak.add(event.get("step"))
        if streak.count < 3:
            return None
        steps = list(streak.steps)
        top = max(range(n), key=lambda i: shares[i])
        return self.finding(
            step=steps[0],
            summary=f"layer {layer} routes {shares[top]:.0%} of tokens to expert {top}; {dead} of {n} experts "
                    f"are dead; routing entropy {entropy:.2f} of the maximum",
            fix="check the load-balancing loss is in the total with a weight that matters (~1e-2); add router "
                "z-loss or router noise",
            evidence={"layer": layer, "shares": [round(s, 4) for s in shares], "entropy": entropy, "dead": dead,
                      "experts": n, "steps": steps, "detected_step": event.get("step")},
        )


_LOSS_KEYS = ("lm_loss", "loss", "eval_loss", "val_loss", "valid_loss", "ce_loss", "nll")


def _perplexity(data: dict[str, Any]) -> tuple[str, Any] | None:
    for key, value in data.items():
        k = key.lower()
        if "perplexity" in k or k == "ppl" or k.endswith("_ppl") or k.startswith("ppl_"):
            return key, value
    return None


class PerplexityImplausible(Rule):
    """TG812 perplexity-implausible: a reported perplexity that is not exp(loss), or overflows.

    ## What it detects
    In `guard.eval(...)` results with a perplexity (`perplexity`, `ppl`, `*_ppl`): a value that is
    inf or NaN, above 1e6, or above the model's output size (worse than a uniform guess); and, when an
    LM loss is reported beside it (`lm_loss`, `loss`, `eval_loss`, ...), a perplexity whose log is not
    that loss (more than 10% apart).

    ## Why it matters
    Perplexity is exp of the mean token cross-entropy. A value of 485 million (seeds 002 and 004)
    means exp of a loss of 20, which is either not the LM loss (a total with other parts) or a model
    worse than guessing; one that disagrees with the reported loss is computed from something else
    (a sum instead of a mean, the mean of per-batch exps). Either way the number misleads.

    ## Example
    `TG812 perplexity-implausible [warning] at step 500: perplexity 4.85e+08 at step 500 is exp(20.0),
    but the reported loss is 3.21 (exp = 24.8)`

    ## What to change
    Compute `perplexity = exp(mean token CE of the LM head only)`; report the LM loss beside it.

    ## Known false positives
    A perplexity averaged per batch (mean of exps) on very uneven batches can differ from exp(mean
    loss) by more than 10%.

    ## Options
    None.
    """

    code, name, severity = "TG812", "perplexity-implausible", "warning"
    needs = (EVAL,)

    def __init__(self, plan: dict[str, Any]) -> None:
        super().__init__(plan)
        size = plan.get("output_size")
        self.size = int(size) if finite(size) and size >= 2 else None

    def on_event(self, event: dict[str, Any]) -> Finding | None:
        if event.get("kind") != "eval":
            return None
        data = event.get("data") or {}
        found = _perplexity(data)
        if found is None:
            return None
        key, ppl = found
        if not isinstance(ppl, (int, float)):
            return None
        step = event.get("step")
        loss_key = next((k for k in _LOSS_KEYS if finite(data.get(k))), None)
        ev = {"perplexity": ppl if finite(ppl) else str(ppl), "key": key, "detected_step": step,
              "loss_key": loss_key, "loss": data.get(loss_key) if loss_key else None, "output_size": self.size}
        fix = "compute perplexity = exp(mean token cross-entropy of the LM head only); report that loss beside it"
        if not finite(ppl) or ppl > 1e6:
            return self.finding(step=step, cause="overflow", fix=fix, evidence=ev,
                                summary=f"{key} {fmt(ppl)} at step {step} has overflowed: it is exp of a loss of "
                                        f"{fmt(math.log(ppl)) if finite(ppl) and ppl > 0 else 'inf'}"
                                        if ppl == ppl else f"{key} is NaN at step {step}: the loss it comes from is NaN")
        if self.size and ppl > 2 * self.size:
            return self.finding(step=step, cause="worse-than-uniform", fix=fix, evidence=ev,
                                summary=f"{key} {fmt(ppl)} at step {step} is worse than a uniform guess over the "
                                        f"model's {fmt(self.size)} outputs")
        if loss_key and ppl > 0:
            loss = data[loss_key]
            # fairseq reports ppl = 2 ** nll_loss (losses in bits): a ppl that is e or 2 to any reported
            # loss-like value is consistent
            losses = [v for k, v in data.items() if "loss" in str(k).lower() and finite(v)]
            if any(abs(math.log(ppl) - v) <= 0.1 * max(1.0, abs(v)) or abs(math.log2(ppl) - v) <= 0.1 * max(1.0, abs(v))
                   for v in losses):
                return None
            if abs(math.log(ppl) - loss) > 0.1 * max(1.0, abs(loss)):
                return self.finding(step=step, cause="not-exp-loss", fix=fix, evidence=ev,
                                    summary=f"{key} {fmt(ppl)} at step {step} is exp({fmt(math.log(ppl))}), but "
                                            f"the reported {loss_key} is {fmt(loss)} (exp = {fmt(math.exp(min(loss, 700)))})")
        return None
