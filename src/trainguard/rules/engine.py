"""The rules engine: feeds a run's events to every rule and collects what they find.

    from trainguard.rules.engine import run_rules
    findings = run_rules(RunReader(run_dir).iter_events(), plan=reader.meta().get("plan"))

A rule sees plain event dicts, never the probe or the store, so the same rules run live (the watchdog's
monitor, the probe's background thread) and offline (`trainguard diagnose`, or a reader that turned an
old log into events). The event dicts are the ones `RunReader.iter_events()` yields:

- a step row: ``{"kind": "step", "step", "t", "loss", "lr", "grad_norm", "update_ratio", "nonfinite",
  "step_time", "data_wait", "loss_scale", "sched_epoch", "parts", "weights", "extra", "rank"}``; any
  field may be missing or None (a log reader knows less than the probe);
- an event: ``{"kind": "eval" | "checkpoint" | "phase" | "sample" | "experts" | "output" | ...,
  "name", "step", "t", "data"}``.

The plan (meta "plan": total_steps, grad_accum, scheduler, sched_horizon, output_size, ...) is passed
alongside: it is what the run meant to do, the events are what it did.

A rule fires at most once per cause: the engine remembers (name, cause) pairs it has reported.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from typing import Any

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
    needs: tuple[Data, ...] = ()
    status = "stable"
    since = "0.1.0"

    def __init__(self, plan: dict[str, Any]) -> None:
        self.plan = plan
        self.total_steps: int | None = _pos_int(plan.get("total_steps"))
        self.grad_accum: int = _pos_int(plan.get("grad_accum")) or 1

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


class Engine:
    """Holds one instance of every rule and feeds them events. Live callers feed as events arrive."""

    def __init__(self, plan: dict[str, Any] | None = None, rules: list[type[Rule]] | None = None,
                 source: str = "rules") -> None:
        self.plan = dict(plan or {})
        self.source = source
        self.rules = [cls(self.plan) for cls in (rules if rules is not None else all_rules())]
        self._reported: set[tuple[str, str | None]] = set()
        self.errors: list[str] = []  # rules that raised: switched off, named here (fail-open)
        self.last_step: int | None = None

    @property
    def rules(self) -> list[Rule]:
        return self._rules

    @rules.setter
    def rules(self, rules: list[Rule]) -> None:
        # Each event goes only to the rules that override its hook: most rules read steps or events,
        # not both, and a call per rule per event is most of the engine's cost on a long log.
        self._rules = list(rules)
        self._step_hooks = [r.on_step for r in self._rules if type(r).on_step is not Rule.on_step]
        self._event_hooks = [r.on_event for r in self._rules if type(r).on_event is not Rule.on_event]
        # rules that compare ranks (TG7xx) also get the events of ranks other than 0
        self._all_rank_hooks = [h for h in self._event_hooks if getattr(h.__self__, "all_ranks", False)]

    def feed(self, event: dict[str, Any]) -> list[Finding]:
        """Feeds one event to every rule; returns the findings that are new."""
        kind = event.get("kind")
        rank = event.get("rank")
        if isinstance(rank, int) and rank > 0:
            # rank 0 speaks for the run (the watchdog writes as -1); other ranks are for the TG7xx rules
            if kind == "step" or not self._all_rank_hooks:
                return []
            hooks = self._all_rank_hooks
        elif kind == "step":
            self.last_step = event.get("step")
            hooks = self._step_hooks
        else:
            hooks = self._event_hooks
        out: list[Finding] = []
        for hook in hooks:  # a dropped rule rebuilds the lists; this loop keeps the one it started with
            try:
                got = hook(event)
                if got is not None:
                    out.extend(self._new(got))  # inside: a rule returning something malformed is broken too
            except Exception as exc:  # a broken rule must not take the others (or the run) down
                self._drop(hook.__self__, exc)
        return out

    def feed_all(self, events: Iterable[dict[str, Any]]) -> list[Finding]:
        out: list[Finding] = []
        for event in events:
            out.extend(self.feed(event))
        return out

    def end(self) -> list[Finding]:
        out: list[Finding] = []
        for rule in list(self.rules):
            try:
                out.extend(self._new(rule.end()))
            except Exception as exc:
                self._drop(rule, exc)
        return out

    def _new(self, got: Finding | list[Finding] | None) -> list[Finding]:
        if got is None:
            return []
        new = []
        for f in got if isinstance(got, list) else [got]:
            key = (f.name, f.cause)
            if key in self._reported:
                continue
            self._reported.add(key)
            f.source = self.source
            if f.t is None:
                f.t = time.time()
            new.append(f)
        return new

    def _drop(self, rule: Rule, exc: Exception) -> None:
        self.errors.append(f"rule {rule.name} raised {exc!r} and was switched off")
        self.rules = [r for r in self.rules if r is not rule]


def run_rules(events: Iterable[dict[str, Any]], plan: dict[str, Any] | None = None,
              source: str = "diagnose") -> list[Finding]:
    """Every finding the rules make over a finished stream of events (a stored run, a parsed log)."""
    engine = Engine(plan, source=source)
    found = engine.feed_all(events)
    return found + engine.end()


def all_rules() -> list[type[Rule]]:
    """The health rules the engine runs, in catalogue order (retired ones left out)."""
    from trainguard.rules.health import HEALTH_RULES  # the rule modules import this one

    return [rule for rule in HEALTH_RULES if rule.status != "removed"]


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



def finite(value: Any) -> bool:
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
