"""Hugging Face Trainer output: `trainer_state.json` and output folders with `checkpoint-N/` inside.

`trainer_state.json` holds the plan (`max_steps`, `logging_steps`, `eval_steps`, `save_steps`) and
`log_history`, one dict per logging call: train rows (`loss`, `grad_norm`, `learning_rate`), eval rows
(`eval_*`) and, at the end of a finished run, the summary (`train_runtime`). The Trainer writes the
folder's own `trainer_state.json` only when training ends; a run that died leaves only the newest
`checkpoint-N/trainer_state.json`, which is then what is read.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trainguard.errors import UserError
from trainguard.ingest.events import Facts, Source, event, metrics_to_events, sniff_binary, to_number
from trainguard.untrusted import json_problem, load_json

MAX_STATE_BYTES = 512 * 1024 * 1024  # a trainer_state.json larger than this is not one
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
    if path.stat().st_size > MAX_STATE_BYTES:
        raise UserError(f"{path} is {path.stat().st_size >> 20} MiB: too large to be a trainer_state.json")
    with open(path, "rb") as f:
        raw = f.read()
    sniff_binary(raw[:8192], path)
    try:
        state = load_json(raw.decode("utf-8", "replace"))
    except ValueError as exc:  # a JSONDecodeError, or a number or nesting Python cannot read
        raise UserError(f"{path}: not valid JSON ({json_problem(exc)}): truncated?") from None
    if not isinstance(state, dict) or not isinstance(state.get("log_history"), list):
        raise UserError(f"{path}: JSON without a log_history list: not a Hugging Face trainer_state.json")
    plan = {"total_steps": _int(state.get("max_steps")), "logging_steps": _int(state.get("logging_steps")),
            "eval_steps": _int(state.get("eval_steps")), "save_steps": _int(state.get("save_steps"))}
    plan = {k: v for k, v in plan.items() if v}
    facts = Facts(mtime=path.stat().st_mtime)
    ckpts = checkpoint_dirs(folder) if folder is not None else []
    facts.snapshot = _snapshot(state, plan.get("total_steps"))
    return Source(path=path, format="hugging face trainer_state.json", plan=plan,
                  events=_events(state["log_history"], ckpts, facts, plan.get("total_steps"), _int(state.get("global_step"))),
                  facts=facts, log_like=True)


def _snapshot(state: dict[str, Any], total: int | None) -> str:
    """Where the run was when the Trainer wrote this file: a checkpoint's copy never holds the summary."""
    step = _int(state.get("global_step"))
    if step is None:
        return "a trainer_state.json without a global_step"
    if total:
        return f"a checkpoint snapshot at step {step:,} of max_steps {total:,} ({step / total:.0%})"
    return f"a checkpoint snapshot at step {step:,}"


def _events(history: list[Any], ckpts: list[tuple[int, Path]], facts: Facts,
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
