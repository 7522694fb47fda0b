"""`trainguard diagnose RUN`: the health rules over a stored run, as if it were running now.

    trainguard diagnose trainguard-runs/20260101-120000-train

Works on any run folder the probe ever wrote, including runs recorded before a rule existed: the
rules re-read the store. Another input (a parsed log) only needs to produce the same event dicts and
call `trainguard.rules.engine.run_rules`.
"""

from __future__ import annotations

from pathlib import Path

from trainguard.errors import UserError
from trainguard.findings import Finding, most_severe_first
from trainguard.rules.engine import Engine
from trainguard.rules.live import output_events, steps_reached
from trainguard.store.reader import RunReader


def diagnose_run(run_dir: str | Path) -> list[Finding]:
    """Every finding the rules make over the stored run, most severe first."""
    run_dir = Path(run_dir)
    with RunReader(run_dir) as reader:
        if not reader.has_db:
            raise UserError(f"{run_dir} has no run.db: the probe never recorded this run, nothing to diagnose")
        plan = reader.meta().get("plan") or {}
        last = reader.last_step()
        engine = Engine(plan, source="diagnose")
        # streamed from the store: a run of millions of steps never sits in a list
        found = engine.feed_all(reader.iter_events())
        found += engine.feed(steps_reached(reader))
    found += engine.feed_all(output_events(run_dir, (last or {}).get("step")))
    return most_severe_first(found + engine.end())
