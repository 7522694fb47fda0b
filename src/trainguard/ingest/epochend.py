"""How a one-row-per-epoch table ended: at its planned last epoch, by early stopping, or cut off.

Ultralytics and YOLOv5 (`results.csv`), timm (`summary.csv`) write one row per finished epoch and no row
that says "done". Their contracts say where the plan is (`args.yaml`/`opt.yaml`: `epochs`, `patience`)
and how early stopping decides (`epoch - best_fitness_epoch >= patience`, fitness 0.1 mAP50 + 0.9
mAP50-95). Without a plan file, Ultralytics' LR still tells something: after warmup it follows
`lr0 x lf(epoch)`, which decays to `lrf x lr0` (lrf <= 0.2 in every shipped hyp) at the last planned
epoch; an LR that has started to decay but is still above 90% of its peak is far from that end.

"Cut off at 7%" and "finished" are never the same verdict; where the files cannot tell, nothing is said.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from trainguard.ingest.events import Facts, to_number
from trainguard.ingest.plans import Plan

STILL_HIGH = 0.9  # a decayed LR above this share of its peak is far from any schedule's end (lrf <= 0.2)
FITNESS_TOL = 1e-5  # results.csv rounds metrics to 5 decimals: fitness closer than this is a tie
_MAP50 = re.compile(r"^metrics/map(?:50|_0\.5)(?:\([a-z]\))?$", re.IGNORECASE)
_MAP5095 = re.compile(r"^metrics/map(?:50-95|_0\.5:0\.95)(?:\([a-z]\))?$", re.IGNORECASE)
_LR = re.compile(r"^(?:lr/pg\d+|x/lr\d+|lr)$", re.IGNORECASE)


@dataclass
class _Seen:
    epochs: list[int] = field(default_factory=list)
    fitness: list[float | None] = field(default_factory=list)
    lrs: list[tuple[int, float]] = field(default_factory=list)  # (epoch, lowest LR over the param groups)


def judge(rows: Iterable[dict[str, Any]], epoch_col: str, facts: Facts, plan: Plan, *,
          lr_schedule: bool) -> Iterator[dict[str, Any]]:
    """Passes the rows on; at the end sets `facts.completed` or (`ends_with`, `last_line`) from the plan.

    Epochs are counted from 0 when the first row is epoch 0 (YOLOv5, timm, Ultralytics before 8.1), from 1
    otherwise (Ultralytics 8.1 on writes `epoch + 1`; a file starts at the run's first epoch). `lr_schedule`: the
    contract says the LR columns follow a schedule that ends low at the planned end (Ultralytics, YOLOv5).
    Only one row per epoch is kept as a number or two: the memory is the table's length in floats.
    """
    seen = _Seen()
    for row in rows:
        e = to_number(row.get(epoch_col))
        if e is not None and e == e and abs(e) < 1e9:
            seen.epochs.append(int(e))
            seen.fitness.append(_fitness(row))
            lrs = [n for k, v in row.items() if k and _LR.match(str(k).strip()) and (n := to_number(v)) is not None]
            if lrs:  # the lowest group: in warmup the bias group starts high and falls onto the schedule
                seen.lrs.append((int(e), min(lrs)))
        yield row
    if not seen.epochs:
        return
    _verdict(seen, facts, plan, 0 if seen.epochs[0] == 0 else 1, lr_schedule)


def _verdict(seen: _Seen, facts: Facts, plan: Plan, first_epoch: int, lr_schedule: bool) -> None:
    last = seen.epochs[-1]
    done = last - first_epoch + 1  # epochs finished
    gap = _epochs_since_best(seen)
    if plan.length:
        if done >= plan.length:
            facts.completed = f"epoch {last} is the last of the {plan.length} epochs {plan.source} plans"
            return
        if plan.patience and gap is not None and gap >= plan.patience:
            facts.completed = (f"early stopping: {gap} epochs without a better fitness since epoch {last - gap}, "
                               f"patience {plan.patience} ({plan.source})")
            return
        stop = (f"; early stopping (patience {plan.patience}) cannot have ended it: the best fitness was "
                f"{gap} epoch{'s' if gap != 1 else ''} before" if plan.patience and gap is not None else "")
        facts.ends_with = "step"
        facts.last_line = f"epoch {last}, {done} of the {plan.length} epochs {plan.source} plans ({done / plan.length:.0%}){stop}"
        return
    if lr_schedule and gap == 0 and len(seen.lrs) >= 2:
        peak_epoch, peak = max(seen.lrs, key=lambda p: (p[1], -p[0]))
        last_epoch, lr = seen.lrs[-1]
        if last_epoch == last and last_epoch > peak_epoch and 0 < lr < peak and lr >= STILL_HIGH * peak:
            facts.ends_with = "step"
            facts.last_line = (f"epoch {last}: LR still {lr / peak:.0%} of its peak {peak:.4g} (epoch {peak_epoch}), far from "
                               "the lrf x lr0 (<= 20%) the schedule reaches at the last planned epoch; the best fitness "
                               "is this epoch's, so early stopping did not end it (no args.yaml/opt.yaml states the plan)")
            return
    facts.ends_with = "unknown"


def _epochs_since_best(seen: _Seen) -> int | None:
    """Epochs from the earliest epoch whose fitness ties the best (within rounding) to the last: the
    smallest patience early stopping could have had. 0 when the last epoch is the best."""
    values = [(e, f) for e, f in zip(seen.epochs, seen.fitness) if f is not None]
    if not values:
        return None
    best = max(f for _, f in values)
    if values[-1][1] is not None and values[-1][1] >= best:
        return 0
    earliest = min(e for e, f in values if f >= best - FITNESS_TOL)
    return seen.epochs[-1] - earliest


def _fitness(row: dict[str, Any]) -> float | None:
    """Ultralytics' and YOLOv5's fitness: 0.1 mAP50 + 0.9 mAP50-95 (box and mask summed); None without them."""
    total, found = 0.0, False
    for k, v in row.items():
        name = str(k).strip()
        n = to_number(v)
        if n is None or n != n:
            continue
        if _MAP50.match(name):
            total, found = total + 0.1 * n, True
        elif _MAP5095.match(name):
            total, found = total + 0.9 * n, True
    return total if found else None
