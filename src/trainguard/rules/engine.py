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

Every rank is judged. Rank 0 (and the watchdog's rank -1, and a log reader's rows without a rank)
speak for the run: their stream goes to the rules as it always did. Each other rank gets rule
instances of its own, fed only its own rows and events, so a rank whose loss goes NaN or whose memory
creeps is found even when rank 0 is fine. A finding of another rank is held until rank 0 has passed
its step: when rank 0 finds the same (name, cause) by then, the problem is the run's and rank 0's
finding speaks for it; otherwise it is that rank's own and says so ("rank 1: ..."). Rules that compare
ranks (`all_ranks = True`, rules/ranks.py) get every rank's stream once.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Iterable
from typing import Any

from trainguard.contract import EVENT_DEVICE, EVENT_DEVICE_SAMPLE
from trainguard.findings import Finding
from trainguard.rules.devices import NOTE_AFTER, DeviceTimeline, annotate, noted_findings
from trainguard.rules.health import HEALTH_RULES
from trainguard.rules.rule import Rule

LEAD_GRACE = 3  # steps rank 0 has past another rank's finding to find the same before that rank's is its own
LEAD_ABSENT = 20  # steps the other ranks go on with no row of rank 0 before they are judged without it
STEP_TIMES = 4096  # (rank, step) -> time kept, for the device attribution of a symptom's step
KEEP_TO_NOTE = 512  # device events waiting to be noted (the newest)


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
        self._other_ranks: dict[int, _RankRules] = {}  # rank > 0 -> its own instances of the per-rank rules
        self._held: list[tuple[int, Finding]] = []  # other ranks' findings waiting for rank 0 to pass their step
        self._others_step: int | None = None  # the newest step of the other ranks (a node without rank 0 has no lead)
        # device events beside the symptoms (rules/devices.py): what each symptom finding is told of
        self.devices = DeviceTimeline()
        # device events that are not faults, waiting NOTE_AFTER seconds for a symptom to name them before they
        # are noted (TG572), and the newest time the stream has reached
        self._to_note: collections.deque[dict[str, Any]] = collections.deque(maxlen=KEEP_TO_NOTE)
        self._clock = 0.0
        self._step_t: collections.OrderedDict[tuple[Any, Any], float] = collections.OrderedDict()

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
        # rules that compare ranks (TG7xx) get every rank's rows and events; the others, one rank's each
        self._all_rank_step_hooks = [h for h in self._step_hooks if _compares_ranks(getattr(h, "__self__", None))]
        self._all_rank_hooks = [h for h in self._event_hooks if _compares_ranks(getattr(h, "__self__", None))]

    def feed(self, event: dict[str, Any]) -> list[Finding]:
        """Feeds one event to every rule; returns the findings that are new."""
        out = self._feed(event)
        t = event.get("t")
        if isinstance(t, (int, float)) and t > self._clock:
            self._clock = float(t)
        if self._to_note:  # after the event: a symptom it brought names its device event first
            out.extend(self._notes(self._clock))
        return out

    def tick(self, now: float) -> list[Finding]:
        """Live callers, at each poll: the device events that waited long enough with no symptom are noted now,
        also while the run writes nothing (a stream's own clock only moves with its events)."""
        return self._notes(now) if self._to_note else []

    def _notes(self, now: float | None) -> list[Finding]:
        """TG572 for the waiting device events that are due (all of them when `now` is None), unless a
        symptom named them meanwhile."""
        due = [e for e in self._to_note if now is None or e["t"] + NOTE_AFTER <= now]
        if not due:
            return []
        for e in due:
            self._to_note.remove(e)
        unexplained = [e for e in due if id(e) not in self.devices.attributed]
        return self._new(noted_findings(unexplained, self.devices)) if unexplained else []

    def _feed(self, event: dict[str, Any]) -> list[Finding]:
        kind = event.get("kind")
        rank = event.get("rank")
        if kind == EVENT_DEVICE or kind == EVENT_DEVICE_SAMPLE:
            if self.devices.note(event):
                self._to_note.append(event)
        elif kind == "step" and isinstance(event.get("t"), (int, float)):
            self._step_t[(rank if isinstance(rank, int) and rank > 0 else 0, event.get("step"))] = event["t"]
            if len(self._step_t) > STEP_TIMES:
                self._step_t.popitem(last=False)
        if isinstance(rank, int) and rank > 0:
            return self._feed_other_rank(rank, event)
        if kind == "step":
            self.last_step = event.get("step")
            out = self._call(self._step_hooks, event)
            return out + self._release(self.last_step)
        return self._call(self._event_hooks, event)

    def _call(self, hooks: list[Any], event: dict[str, Any], rank: int | None = None) -> list[Finding]:
        out: list[Finding] = []
        for hook in hooks:  # a dropped rule rebuilds the lists; this loop keeps the one it started with
            try:
                got = hook(event)
                if got is None:
                    continue
                if rank is None:
                    out.extend(self._new(self._earlier_held(got)))  # a malformed return breaks the rule too
                else:
                    self._hold(rank, got)
            except Exception as exc:  # a broken rule must not take the others (or the run) down
                self._drop(hook.__self__, exc)
        return out

    def _feed_other_rank(self, rank: int, event: dict[str, Any]) -> list[Finding]:
        """A row or event of rank > 0: to that rank's own rules, and to the rules that compare ranks."""
        own = self._other_ranks.get(rank)
        if own is None:
            classes = [type(r) for r in self.rules if not _compares_ranks(r)]
            own = self._other_ranks[rank] = _RankRules([cls(self.plan) for cls in classes])
        is_step = event.get("kind") == "step"
        if is_step and isinstance(event.get("step"), int):
            self._others_step = max(self._others_step or 0, event["step"])
        out = self._call(self._all_rank_step_hooks if is_step else self._all_rank_hooks, event)
        for hook in own.step_hooks if is_step else own.event_hooks:
            try:
                got = hook(event)
                if got is not None:
                    self._hold(rank, got)
            except Exception as exc:  # one rank's broken rule is switched off for that rank alone
                rule = getattr(hook, "__self__", None)
                own.drop(rule)
                self.errors.append(f"rule {getattr(rule, 'name', '?')} raised {exc!r} on rank {rank} and was "
                                   "switched off there")
        # A node's watchdog without rank 0 (another node has it) has no lead to wait for: once its ranks are
        # LEAD_ABSENT steps on with no row of rank 0 at all, their own pace stands in for rank 0's.
        lead = self.last_step
        if lead is None and self._others_step is not None:
            lead = self._others_step - LEAD_ABSENT
        return out + self._release(lead)

    def _earlier_held(self, got: Finding | list[Finding]) -> list[Finding]:
        """Rank 0's findings, each replaced by another rank's held finding of the same (name, cause) at an
        earlier step: that rank had it first (rank 1's NaN at step 12 is the origin of rank 0's at 13)."""
        out = []
        for f in got if isinstance(got, list) else [got]:
            f_step = getattr(f, "step", None)
            earlier = [(r, h) for r, h in self._held if isinstance(h, Finding) and (h.name, h.cause) == (
                getattr(f, "name", None), getattr(f, "cause", None)) and h.step is not None
                and isinstance(f_step, int) and h.step < f_step]
            if earlier:
                rank, h = min(earlier, key=lambda rh: rh[1].step or 0)
                self._held = [(r, x) for r, x in self._held if x is not h]
                out.append(_attributed(rank, h))
            else:
                out.append(f)
        return out

    def _hold(self, rank: int, got: Finding | list[Finding]) -> None:
        for f in got if isinstance(got, list) else [got]:
            if not isinstance(f, Finding):
                raise TypeError(f"a rule returned {type(f).__name__}, not a Finding")
            if (f.name, f.cause) not in self._reported:
                self._held.append((rank, f))

    def _release(self, lead_step: int | None, everything: bool = False) -> list[Finding]:
        """Other ranks' held findings whose step rank 0 has passed (all of them at the end of the stream)."""
        if not self._held:
            return []
        keep, out = [], []
        for rank, f in self._held:
            # rank 0 may be sure of the same a step or two later (a rate, a window): a few steps' grace
            at = f.evidence.get("detected_step", f.step)
            if not everything and isinstance(at, int) and (lead_step is None or lead_step < at + LEAD_GRACE):
                keep.append((rank, f))
                continue
            if (f.name, f.cause) in self._reported:
                continue  # rank 0 found it too: the run's problem, said once
            out.extend(self._new(_attributed(rank, f)))
        self._held = keep
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
        out.extend(self._notes(None))  # the events of the stream's last seconds: no symptom came after them
        for rank, own in sorted(self._other_ranks.items()):
            for rule in list(own.rules):
                try:
                    got = rule.end()
                    if got is not None:
                        self._hold(rank, got)
                except Exception as exc:
                    own.drop(rule)
                    self.errors.append(f"rule {rule.name} raised {exc!r} on rank {rank} and was switched off there")
        return out + self._release(self.last_step, everything=True)

    def _new(self, got: Finding | list[Finding] | None) -> list[Finding]:
        if got is None:
            return []
        new = []
        for f in got if isinstance(got, list) else [got]:
            key = (f.name, f.cause)
            if key in self._reported:
                continue
            self._reported.add(key)
            rank = f.evidence.get("rank") if isinstance(f.evidence.get("rank"), int) else 0
            annotate(f, self.devices, self._step_t.get((rank, f.step)))
            f.source = self.source
            if f.t is None:
                f.t = time.time()
            new.append(f)
        return new

    def _drop(self, rule: Rule, exc: Exception) -> None:
        self.errors.append(f"rule {rule.name} raised {exc!r} and was switched off")
        self.rules = [r for r in self.rules if r is not rule]


def _attributed(rank: int, f: Finding) -> Finding:
    """Another rank's finding, saying whose it is."""
    f.summary = f"rank {rank}: {f.summary}"
    f.evidence = {**f.evidence, "rank": rank}
    return f


class _RankRules:
    """One rank's own instances of the per-rank rules, and the hooks each event kind goes to."""

    def __init__(self, rules: list[Rule]) -> None:
        self.rules = rules
        self._index()

    def _index(self) -> None:
        self.step_hooks = [r.on_step for r in self.rules if type(r).on_step is not Rule.on_step]
        self.event_hooks = [r.on_event for r in self.rules if type(r).on_event is not Rule.on_event]

    def drop(self, rule: Rule | None) -> None:
        self.rules = [r for r in self.rules if r is not rule]
        self._index()


def _compares_ranks(rule: Any) -> bool:
    return bool(getattr(rule, "all_ranks", False))


def run_rules(events: Iterable[dict[str, Any]], plan: dict[str, Any] | None = None,
              source: str = "diagnose") -> list[Finding]:
    """Every finding the rules make over a finished stream of events (a stored run, a parsed log)."""
    engine = Engine(plan, source=source)
    found = engine.feed_all(events)
    return found + engine.end()


def all_rules() -> list[type[Rule]]:
    """The health rules the engine runs, in catalogue order (retired ones left out)."""
    return [rule for rule in HEALTH_RULES if rule.status != "removed"]
