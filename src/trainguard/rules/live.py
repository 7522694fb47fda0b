"""The rules on a live run, fed as the run writes.

Two feeds, one engine: the watchdog's monitor (`RulesMonitor`, polled by the supervisor every half
second) reads what the store gained since its last look, so it feeds the rules exactly what
`trainguard diagnose` reads afterwards. The probe, when no watchdog is there, hands the rows and events
it queues for the store straight to `InboxRules`: reading them back from SQLite in the training process
cost a query, JSON decoding and a dict per row on a thread that shares the GIL with the loop.
"""

from __future__ import annotations

import collections
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from trainguard.errors import UserError
from trainguard.findings import Finding
from trainguard.rules.engine import Engine
from trainguard.rules.ranks import STEPS_REACHED
from trainguard.store.reader import RunReader


class LiveRules:
    """Feeds new steps (by rowid) and events (by id) of one run folder to an engine."""

    def __init__(self, source: str = "rules") -> None:
        self.source = source
        self.engine: Engine | None = None
        self.rowid = 0
        self.event_id = 0

    def poll(self, reader: RunReader, extra: list[dict[str, Any]] | None = None) -> list[Finding]:
        """New findings from what was committed since the last poll (plus `extra` events, e.g. output)."""
        if self.engine is None:
            plan = reader.meta().get("plan")
            if plan is None and reader.step_count() == 0:
                return []  # the probe has not said what the run plans yet
            self.engine = Engine(plan or {}, source=self.source)
        steps = list(reader.steps(since_rowid=self.rowid))
        events = [e for e in reader.events(since_id=self.event_id) if e["kind"] != "finding"]
        if steps:
            self.rowid = steps[-1]["rowid"]
        if events:
            self.event_id = events[-1]["id"]
        merged = sorted(steps + events + list(extra or []), key=lambda e: e.get("t") or 0)
        # (tick: a device event no symptom came with is noted within seconds, also while the run is silent)
        return self.engine.feed_all(merged) + self.engine.tick(time.time())

    def end(self, reader: RunReader | None = None) -> list[Finding]:
        """The rules' end-of-run checks; with the run's `reader`, told first how far each rank got."""
        if self.engine is None:
            return []
        found = self.engine.feed(steps_reached(reader)) if reader is not None else []
        return found + self.engine.end()


def steps_reached(reader: RunReader) -> dict[str, Any]:
    """The event that tells the rules, before their end-of-run checks, the last step each rank is known to
    have finished besides its rows (rules/ranks.py, `STEPS_REACHED`)."""
    try:
        reached = reader.steps_reached()
    except UserError:  # a store that cannot be read now (locked, damaged): the rows alone, as before
        reached = {}
    return {"kind": STEPS_REACHED, "t": None, "data": reached}


class InboxRules:
    """The probe's rules: rows and events arrive in memory (`take`, from any thread) and are fed to the
    engine in time order at each `poll` (the probe's background thread, every two seconds)."""

    MAX_WAITING = 200_000  # items between two polls; past this the oldest go (counted), memory stays bounded

    def __init__(self, plan: dict[str, Any], source: str = "probe") -> None:
        self.engine = Engine(plan, source=source)
        self.inbox: collections.deque[dict[str, Any]] = collections.deque(maxlen=self.MAX_WAITING)
        self.dropped = 0

    def take(self, item: dict[str, Any]) -> None:
        if item.get("kind") != "finding":  # the rules' own output, written back as events
            if len(self.inbox) == self.MAX_WAITING:
                self.dropped += 1
            self.inbox.append(item)

    def poll(self, through: Callable[[list[dict[str, Any]]], Iterable[dict[str, Any]]] | None = None) -> list[Finding]:
        """Feeds what arrived since the last poll, in time order; `through` wraps the ordered items (the
        probe passes its pacing, so a long pass does not hold the training thread back)."""
        take = self.inbox.popleft  # (only this thread takes; others only append)
        batch = [take() for _ in range(len(self.inbox))]
        batch.sort(key=lambda e: e.get("t") or 0)
        found = self.engine.feed_all(through(batch) if through is not None else batch)
        return found + self.engine.tick(time.time())

    def end(self) -> list[Finding]:
        return self.engine.end()


class RulesMonitor:
    """The watchdog's monitor for the health rules (see `watchdog.supervisor.Monitor`)."""

    def __init__(self) -> None:
        self.live = LiveRules(source="rules")
        self._output_step: int | None = None

    def poll(self, state: Any) -> list[Finding]:
        # The captured output becomes an event, so `log-flood` reads lines the same way offline. Only when
        # the step moved: lines counted against a step that stands still (a store that stopped taking rows,
        # a read-only run folder) would read as a flood; real lines between steps count at the next step.
        output = None
        if state.step and state.step != self._output_step:
            self._output_step = state.step
            output = {"kind": "output", "t": state.now, "step": state.step, "data": {"lines": state.output_lines}}
        return self.live.poll(state.reader, extra=[output] if output else None)

    def finish(self, state: Any) -> list[Finding]:
        """After the process ended: the last rows it wrote, then the rules' end-of-run checks."""
        return self.poll(state) + self.live.end(state.reader)


def output_events(run_dir: Path, steps: int | None) -> list[dict[str, Any]]:
    """Offline, output.log stands for the lines the watchdog counted: one event at the start, one at the end."""
    from trainguard.folderio import regular_or_missing

    path = Path(run_dir) / "output.log"
    if not steps or not regular_or_missing(path, "output.log"):  # a link or a FIFO: UserError, one line
        return []
    try:
        lines = count_lines(path)
    except OSError:
        return []
    return [{"kind": "output", "t": None, "step": 0, "data": {"lines": 0}},
            {"kind": "output", "t": None, "step": steps, "data": {"lines": lines}}]


def count_lines(path: Path, block: int = 1 << 20) -> int:
    """Lines ended by \\n, \\r\\n or a lone \\r (a tqdm redraw), read a block at a time: output.log
    may be gigabytes."""
    lines = 0
    cr_pending = False  # the previous block ended in \r: a \n opening this one belongs to it
    from trainguard.folderio import open_fd

    with os.fdopen(open_fd(path, "output.log"), "rb") as f:  # never through a link, never a FIFO
        while chunk := f.read(block):
            lines += chunk.count(b"\n") + chunk.count(b"\r") - chunk.count(b"\r\n")
            if cr_pending and chunk.startswith(b"\n"):
                lines -= 1
            cr_pending = chunk.endswith(b"\r")
    return lines
