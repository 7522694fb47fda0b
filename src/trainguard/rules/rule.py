"""One rule of the engine, and the small helpers the rule modules share.

A rule sees plain event dicts (a step row or an event, as rules/engine.py describes them) and the run's
plan; the engine (rules/engine.py) feeds it. A rule module imports this one, never the engine.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, TypeGuard

from trainguard.findings import Data, Finding


class Rule:
    """One rule: consumes events, returns a Finding when it is sure. This class is the whole surface.

    A subclass is the rule's one declaration: it sets `code`, `name`, `severity`, `needs` (the data it
    reads) and, if not stable, `status`; its docstring is the rule's page. It overrides any of `on_step`,
    `on_event`, `end`. Each returns a Finding or None (or a list, for a rule that escalates). A rule
    keeps whatever state it needs; it must stay cheap per event (it may run in the training process)
    and bounded: nothing it keeps may grow with the number of steps or events (a 1 GB log is 15
    million steps). Windows are deques, streaks are `Streak`s, whole-run summaries are running counts;
    tests/test_rules.py checks it.
    """

    code = ""
    name = ""
    severity = "warning"
    needs: ClassVar[tuple[Data, ...]] = ()
    status = "stable"
    since = "0.1.0"

    def __init__(self, plan: dict[str, Any]) -> None:
        self.plan = plan
        self.total_steps: int | None = _pos_int(plan.get("total_steps"))
        self.grad_accum: int = _pos_int(plan.get("grad_accum")) or 1
        # `watch(learning=False)`: a model run without training (an evaluation, a teacher's cache job)
        self.learning: bool = plan.get("learning") is not False

    def on_step(self, row: dict[str, Any]) -> Finding | list[Finding] | None:
        """Called with each optimizer step's row, in order."""
        return None

    def on_event(self, event: dict[str, Any]) -> Finding | list[Finding] | None:
        """Called with each other event (eval, checkpoint, phase, sample, experts, output...)."""
        return None

    def end(self) -> Finding | list[Finding] | None:
        """Called once when the stream is over (offline, or when the run ended)."""
        return None

    # -- helpers for subclasses ---------------------------------------------------------------------

    def finding(self, *, step: int | None, summary: str, fix: str, evidence: dict[str, Any],
                severity: str | None = None, cause: str | None = None) -> Finding:
        return Finding.of(self, severity=severity, summary=summary, evidence=evidence, fix=fix, step=step,
                          cause=cause, source="rules")

    def fraction(self, step: int | None) -> float | None:
        """How far into the planned run `step` is (0..1+), None when the plan has no length."""
        if step is None or not self.total_steps:
            return None
        return step / self.total_steps

    def window(self, share: float = 0.05, lo: int = 20, hi: int = 200) -> int:
        """A window in steps: `share` of the planned run, clamped to [lo, hi] (hi without a plan)."""
        if not self.total_steps:
            return hi
        return int(min(hi, max(lo, share * self.total_steps)))


# -- small helpers shared by the rule modules --------------------------------------------------------

class Streak:
    """Consecutive steps (or evaluations) of one kind: how many, and the first `keep` of them.

    A finding shows the first few steps of a streak; the streak itself may last the rest of a long log,
    so the rule keeps its count and its head, never the whole list.
    """

    __slots__ = ("count", "steps", "keep")

    def __init__(self, keep: int = 20) -> None:
        self.count = 0
        self.steps: list[Any] = []
        self.keep = keep

    def add(self, step: Any) -> None:
        self.count += 1
        if len(self.steps) < self.keep:
            self.steps.append(step)

    def clear(self) -> None:
        self.count = 0
        self.steps = []



def finite(value: Any) -> TypeGuard[float]:
    """A real number that is not NaN or inf (bools are not numbers here). Hot: called per field per step."""
    kind = type(value)
    if kind is float:
        return value - value == 0.0  # nan and inf give nan
    if kind is int:
        return True
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def median(values: list[float]) -> float:
    s = sorted(values)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def robust_std(values: list[float]) -> float:
    """1.4826 x the median absolute deviation: a standard deviation that one spike cannot inflate."""
    if len(values) < 2:
        return 0.0
    m = median(values)
    return 1.4826 * median([abs(v - m) for v in values])


def fmt(value: Any) -> str:
    """A number as a person reads it in a finding: 3 significant digits, scientific when tiny or huge."""
    if not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    if not math.isfinite(value):
        return str(value)
    if value == 0:
        return "0"
    if abs(value) < 1e-3 or abs(value) >= 1e5:
        return f"{value:.2e}"
    return f"{value:.3g}"


def _pos_int(value: Any) -> int | None:
    try:
        v = int(value)
    except (TypeError, ValueError):
        return None
    return v if v > 0 else None
