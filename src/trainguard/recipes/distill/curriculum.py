"""One schedule for every loss weight: linear ramps over a window of training, reported each step.

    w(step) = start                                  before the window
            = start + (end - start) * (f - from) / (to - from)   inside it (f = step / total_steps)
            = end                                    after it

Linear on purpose: a quadratic ramp sits at 6.7% of its target half-way through (seed 004). The LM
weight is a constant and never zero (checked by the config). Every weight returned here is what the
loop multiplies in and what it reports to the guard: there is no other place a weight can come from.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainguard.recipes.distill.config import LossConfig, TermConfig


def ramp(start: float, end: float, frm: float, to: float, progress: float) -> float:
    if progress >= to:  # first: a window of zero width ([f, f]) is a step to `end` at f
        return end
    if progress <= frm:
        return start
    return start + (end - start) * (progress - frm) / (to - frm)


@dataclass
class Curriculum:
    lm: float
    terms: dict[str, TermConfig]
    total_steps: int

    @classmethod
    def from_config(cls, loss: LossConfig, total_steps: int) -> Curriculum:
        return cls(lm=loss.lm, terms={"kd": loss.kd, "hidden": loss.hidden, "routing": loss.routing,
                                      "balance": loss.balance}, total_steps=total_steps)

    def weights(self, step: int) -> dict[str, float]:
        """Weights for the optimizer step `step` (0-based: the update being computed)."""
        f = step / self.total_steps
        w = {"lm": self.lm}
        for name, t in self.terms.items():
            w[name] = ramp(t.start, t.end, t.ramp[0], t.ramp[1], f)
        return w

    def ever_on(self, name: str) -> bool:
        t = self.terms[name]
        return max(t.start, t.end) > 0

    @property
    def ramp_end_step(self) -> int:
        return round(max(t.ramp[1] for t in self.terms.values()) * self.total_steps)
