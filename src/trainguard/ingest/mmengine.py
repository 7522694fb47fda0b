"""mmengine's `vis_data/scalars.json` and its config, as their contract says (`formats.mmengine`).

Train rows count `step` in iterations (`iter`, with `epoch` beside it); validation rows of an epoch-based
loop count it in epochs. Validation rows are put at the iteration of the train row before them, with
their metrics (`coco/AP`, `accuracy/top1`) marked as evaluations. The config (`config.py` beside it, or
the run's `<timestamp>.py` one folder up) states `train_cfg.max_epochs` or `max_iters`: a last train row
short of it is a run cut off.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from trainguard.ingest.events import Facts, to_number
from trainguard.ingest.formats import FormatContract
from trainguard.ingest.plans import Plan, read_plan

_TIMING = ("time", "data_time", "memory", "step")


def plan(folder: Path, contract: FormatContract | None) -> Plan:
    stated = read_plan(folder, contract)
    if not stated.length and folder.name == "vis_data":
        stated = read_plan(folder.parent, contract)  # mmengine also dumps the config beside vis_data
    return stated


def rows(records: Iterable[dict[str, Any]], facts: Facts, stated: Plan) -> Iterator[dict[str, Any]]:
    it: int | None = None
    epoch: int | None = None
    for rec in records:
        n = to_number(rec.get("iter"))
        if n is not None and n == n and abs(n) < 1e15:
            it = int(n)
            e = to_number(rec.get("epoch"))
            epoch = int(e) if e is not None and e == e and abs(e) < 1e9 else epoch
            yield rec
            continue
        if it is None:
            facts.skipped += 1  # a validation row before any training row: nothing to place it at
            continue
        yield {"step": it, **{(k if k in _TIMING else f"val/{k}"): v for k, v in rec.items() if k != "step"}}
    _verdict(it, epoch, facts, stated)


def _verdict(it: int | None, epoch: int | None, facts: Facts, stated: Plan) -> None:
    if it is None or not stated.length or not stated.length_key:
        facts.ends_with = "unknown"
        return
    by_epoch = "epochs" in stated.length_key
    reached = epoch if by_epoch else it
    unit = "epoch" if by_epoch else "iteration"
    if reached is not None and reached >= stated.length:
        facts.completed = f"{unit} {reached} is the last of the {stated.length} {stated.source} plans"
        return
    facts.ends_with = "step"
    share = f" ({reached / stated.length:.0%})" if reached is not None else ""
    facts.last_line = (f"{unit} {reached} (iteration {it}) of the {stated.length} {unit}s {stated.source} plans "
                       f"({stated.length_key}){share}")
