"""detectron2's `metrics.json`, as its contract says (`trainguard.ingest.formats.detectron2`).

Each loss is the median of its last 20 iterations, so the parts never sum to `total_loss` (the reader
states `parts_relation: median` in the plan; the composition rules respect it). The evaluation hook
writes `bbox/AP`, `segm/AP50`... on the row of the iteration it evaluated: those become evaluations.
The writer's last row comes after the last iteration, when `eta_seconds` (mean iteration time x
iterations left) is about one iteration's time: a last row that still has minutes left was cut off.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from trainguard.ingest.events import Facts, to_number

EVAL_TASKS = ("bbox/", "segm/", "keypoints/", "sem_seg/", "panoptic_seg/", "box_proposals/")
LEFT_AT_END = 2.0  # iterations an ETA may still count at the writer's last write


def rows(records: Iterable[dict[str, Any]], facts: Facts) -> Iterator[dict[str, Any]]:
    """The records with their evaluation keys marked as such; the end judged from the last ETA."""
    last: dict[str, float | None] = {}
    for rec in records:
        it = to_number(rec.get("iteration"))
        # an evaluation written as a row of its own (a test after training, a custom loop's writer) carries no
        # ETA: it says nothing of how much training was left, so the training row before it still decides
        if it is not None and (rec.get("eta_seconds") is not None or not last):
            last = {"iteration": it, "eta": to_number(rec.get("eta_seconds")), "time": to_number(rec.get("time"))}
        yield {(f"eval/{k}" if str(k).startswith(EVAL_TASKS) else k): v for k, v in rec.items()}
    _verdict(last, facts)


def _verdict(last: dict[str, float | None], facts: Facts) -> None:
    it, eta, per = last.get("iteration"), last.get("eta"), last.get("time")
    if it is None or eta is None or eta != eta:
        facts.ends_with = "unknown"  # no ETA written: nothing in the file says how long the run was meant to be
        return
    left = eta / per if per and per > 0 and per == per else None
    if eta <= 0 or (left is not None and left <= LEFT_AT_END):
        facts.completed = f"the last row (iteration {int(it)}) has eta_seconds {eta:.3g}: the last iteration"
        return
    facts.ends_with = "step"
    about = (f", about {left:,.0f} more iterations at {per:.3g} s each (about {int(it) + 1 + round(left):,} planned)"
             if left is not None else "")
    facts.last_line = f"iteration {int(it)} still has eta_seconds {eta:,.0f} left{about}"
