"""Hugging Face Trainer output: `trainer_state.json` and output folders with `checkpoint-N/` inside.

`trainer_state.json` holds the plan (`max_steps`, `logging_steps`, `eval_steps`, `save_steps`) and
`log_history`, one dict per logging call: train rows (`loss`, `grad_norm`, `learning_rate`), eval rows
(`eval_*`) and, at the end of a finished run, the summary (`train_runtime`). The Trainer writes the
folder's own `trainer_state.json` only when training ends; a run that died leaves only the newest
`checkpoint-N/trainer_state.json`, which is then what is read. The file is streamed, a record at a
time (`trainguard.ingest.jsonstream`): a long run's state passes 100 MB. Its contract:
`trainguard.ingest.formats.huggingface`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from trainguard.errors import UserError
from trainguard.ingest.events import Facts, Source, event, metrics_to_events, sniff_binary, to_number
from trainguard.ingest.jsonstream import ITEM, members
from trainguard.untrusted import json_problem

MAX_STATE_BYTES = 4 << 30  # a trainer_state.json larger than this is not one (it is streamed: size costs time only)
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def find_state(folder: Path) -> Path | None:
    """The trainer_state.json that says most: the folder's own, else the newest checkpoint's."""
    own = folder / "trainer_state.json"
    if own.is_file():
        return own
    checkpoints = checkpoint_dirs(folder)
    for _, ckpt in reversed(checkpoints):
        if (ckpt / "trainer_state.json").is_file():
            return ckpt / "trainer_state.json"
    return None


def checkpoint_dirs(folder: Path) -> list[tuple[int, Path]]:
    found = []
    try:
        entries = list(folder.iterdir())
    except OSError:
        return []
    for p in entries:
        m = _CHECKPOINT.match(p.name)
        if m and p.is_dir():
            found.append((int(m.group(1)), p))
    return sorted(found)


def read_trainer_state(path: Path, folder: Path | None = None) -> Source:
    """The file is read twice, streaming (`trainguard.ingest.jsonstream`): once for the plan, which the
    Trainer writes after `log_history` (its keys are sorted), and once for the records, lazily."""
    from trainguard.ingest.formats import contract

    size = path.stat().st_size
    if size > MAX_STATE_BYTES:
        raise UserError(f"{path} is {size >> 20} MiB: too large to be a trainer_state.json")
    with open(path, "rb") as f:
        sniff_binary(f.read(8192), path)
    state = _top_level(path)
    plan: dict[str, Any] = {"total_steps": _int(state.get("max_steps")), "logging_steps": _int(state.get("logging_steps")),
                            "eval_steps": _int(state.get("eval_steps")), "save_steps": _int(state.get("save_steps"))}
    plan = {k: v for k, v in plan.items() if v}
    c = contract(FORMAT)
    if c is not None:
        plan["parts_relation"] = c.parts
    facts = Facts(mtime=path.stat().st_mtime)
    ckpts = checkpoint_dirs(folder) if folder is not None else []
    facts.snapshot = _snapshot(state, plan.get("total_steps"))
    return Source(path=path, format=FORMAT, plan=plan,
                  events=_events(_records(path, facts), ckpts, facts, plan.get("total_steps"), _int(state.get("global_step"))),
                  facts=facts, log_like=True)


FORMAT = "hugging face trainer_state.json"


def _top_level(path: Path) -> dict[str, Any]:
    """The members of the state other than the records (which are decoded and dropped: this pass also
    proves the whole file is JSON before any record is judged)."""
    state: dict[str, Any] = {}
    history = False
    try:
        for name, value in members(path, "log_history"):
            if name == "log_history" + ITEM:
                history = True
            elif name == "log_history":
                history = isinstance(value, list)
            elif not isinstance(value, (list, dict)):
                state[name] = value
    except ValueError as exc:  # a JSONDecodeError, or a number or nesting Python cannot read
        raise UserError(f"{path}: not valid JSON ({json_problem(exc)}): truncated?") from None
    if not history:
        raise UserError(f"{path}: JSON without a log_history list: not a Hugging Face trainer_state.json")
    return state


def _records(path: Path, facts: Facts) -> Iterator[Any]:
    try:
        for name, value in members(path, "log_history"):
            if name == "log_history" + ITEM:
                yield value
            elif name == "log_history" and isinstance(value, list):
                yield from value
    except ValueError:  # the file changed since the first pass (a Trainer saving over it): keep what was read
        facts.skipped += 1


def _snapshot(state: dict[str, Any], total: int | None) -> str:
    """Where the run was when the Trainer wrote this file: a checkpoint's copy never holds the summary."""
    step = _int(state.get("global_step"))
    if step is None:
        return "a trainer_state.json without a global_step"
    if total:
        return f"a checkpoint snapshot at step {step:,} of max_steps {total:,} ({step / total:.0%})"
    return f"a checkpoint snapshot at step {step:,}"


def _events(history: Iterable[Any], ckpts: list[tuple[int, Path]], facts: Facts,
            total_steps: int | None, global_step: int | None) -> Iterator[dict[str, Any]]:
    pending = list(ckpts)
    last_step: int | None = None
    for entry in history:
        if not isinstance(entry, dict):
            facts.skipped += 1
            continue
        step = _int(entry.get("step"))
        if step is None:
            facts.skipped += 1
            continue
        last_step = step
        while pending and pending[0][0] <= step:
            n, p = pending.pop(0)
            yield event("checkpoint", n, {"path": str(p)}, name=p.name)
        if "train_runtime" in entry:
            facts.completed = f"log_history ends with the training summary at step {step}"
            continue
        metrics = {k: v for k, v in ((k, to_number(v)) for k, v in entry.items()
                                     if k not in ("step", "epoch", "total_flos")) if v is not None}
        # HF writes eval rows with eval_ keys only; `metrics_to_events` splits train and eval by prefix
        yield from metrics_to_events(step, metrics, facts)
    for n, p in pending:
        yield event("checkpoint", n, {"path": str(p)}, name=p.name)
    reached = max(last_step or 0, global_step or 0)
    if facts.completed is None and total_steps and reached >= total_steps:
        # a checkpoint's own state stops before the summary: reaching max_steps is the sign of the end
        # (the last log row may sit a few steps before it, between two logging steps)
        facts.completed = f"global_step reaches max_steps ({total_steps})"


def _int(value: Any) -> int | None:
    number = to_number(value)
    if number is None or number != number or abs(number) > 1e15:
        return None
    return int(number) if number > 0 else None
