"""mmcv 1.x's `<timestamp>.log.json` (TextLoggerHook._dump_log), as its contract says (`formats.mmcv`).

Its first record is the runner's meta (`env_info`, `config` as the config file's text, `seed`, `exp_name`);
every other record is one `log()` call: `mode` ("train" or "val"), `epoch` (1-based), `iter` and the
averaged values. An EpochBasedRunner writes `iter` within the epoch (inner_iter + 1): the global step is
(epoch - 1) x iterations per epoch + iter, iterations per epoch being the largest `iter` a train row of
an earlier epoch reached. An IterBasedRunner writes the global iteration. `mode: val` records are
evaluations, put at the step of the train record before them. The plan is the config's
`runner = dict(type=..., max_epochs=N)` (or `max_iters=N`, or the older `total_epochs = N`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import Any

from trainguard.ingest.events import Facts, to_number

_RUNNER = re.compile(r"runner\s*=\s*dict\(([^)]{0,2000})\)")
_LENGTH = re.compile(r"\b(max_epochs|max_iters)\s*=\s*(\d{1,12})\b")
_TOTAL_EPOCHS = re.compile(r"^total_epochs\s*=\s*(\d{1,12})\s*$", re.MULTILINE)
_NOT_METRICS = ("mode", "epoch", "iter", "lr", "time", "data_time", "memory", "momentum")


def is_log_json(name: str, first: dict[str, Any]) -> bool:
    """The meta record (env_info, config) or a first `log()` record (mode train/val, epoch, iter): copied
    without its meta record, or renamed (`log.json`), the records are still TextLoggerHook's own."""
    if "env_info" in first and "config" in first:
        return True
    if not {"mode", "epoch", "iter"} <= set(first):
        return False
    return name.lower().endswith(".log.json") or first.get("mode") in ("train", "val")


def plan_of(first: dict[str, Any]) -> tuple[str, int] | None:
    """("max_epochs" | "max_iters", N) from the meta record's config text."""
    text = first.get("config")
    if not isinstance(text, str):
        return None
    runner = _RUNNER.search(text)
    if runner is not None and (m := _LENGTH.search(runner.group(1))) is not None:
        return m.group(1), int(m.group(2))
    if (m := _TOTAL_EPOCHS.search(text)) is not None:  # mmdet 1.x/2.x configs before `runner` existed
        return "max_epochs", int(m.group(1))
    return None


def rows(records: Iterable[dict[str, Any]], facts: Facts, plan: tuple[str, int] | None) -> Iterator[dict[str, Any]]:
    by_iter = plan is not None and plan[0] == "max_iters"
    per = 0  # iterations per epoch: the largest inner iter a train record reached
    per_before = 0  # the same over the epochs before the current one: an epoch closes when it reaches it
    first_epoch: int | None = None
    step = 0
    epoch = 0
    it = 0
    ended_with_val = False
    for rec in records:
        mode = rec.get("mode")
        e, i = to_number(rec.get("epoch")), to_number(rec.get("iter"))
        if mode not in ("train", "val") or e is None or i is None or not (0 <= e < 1e9 and 0 <= i < 1e12):
            continue  # the meta record, or one this writer never writes
        values = {k: v for k, v in rec.items() if k not in _NOT_METRICS}
        if mode == "val":
            ended_with_val = True
            yield {"step": step, **{f"val/{k}": v for k, v in values.items()}}
            continue
        if int(e) != epoch:
            per_before = per
        epoch, it, ended_with_val = int(e), int(i), False
        if first_epoch is None:
            first_epoch = epoch
        if by_iter:
            step = max(step, it)
        else:
            new = (epoch - first_epoch) * per + it
            per = max(per, it)
            step = max(step, new)
        yield {"step": step, "lr": rec.get("lr"), **values}
    closed = ended_with_val or 0 < per_before <= it
    _verdict(epoch, it, step, closed, facts, plan)


def _verdict(epoch: int, it: int, step: int, closed: bool, facts: Facts, plan: tuple[str, int] | None) -> None:
    if not step or plan is None:
        facts.ends_with = "unknown" if step else facts.ends_with
        return
    key, length = plan
    if key == "max_iters":
        if it >= length:
            facts.completed = f"iteration {it} is the last of the {length} the config's runner plans"
            return
        facts.cut_off = f"iteration {it:,} of {length:,} ({it / length:.0%})"
    else:
        if epoch >= length and closed:
            facts.completed = f"epoch {epoch} is the last of the {length} the config's runner plans"
            return
        done = epoch - 1 + (1 if closed else 0)
        facts.cut_off = f"epoch {done} of {length} ({done / length:.0%}), in epoch {epoch} at iteration {it}"
    facts.ends_with = "step"
