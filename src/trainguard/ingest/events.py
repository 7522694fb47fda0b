"""The event dicts a reader produces, and how a metric's name maps onto a step row's fields.

A step row is `{"kind": "step", "step", "t", "loss", "lr", "grad_norm", "update_ratio", "nonfinite",
"parts", "weights", "extra"}` (see `trainguard.rules.engine`); a log knows less than the probe, so any
field may be None. Other events are `{"kind", "name", "step", "t", "data"}`.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainguard.errors import UserError
from trainguard.rules.signatures import Scanner

# Metric names, lower-cased, as the frameworks and people write them.
LOSS_NAMES = ("loss", "train_loss", "train/loss", "loss_step", "train_loss_step", "training_loss",
              "train/loss_step", "tr_loss", "total_loss", "batch_loss", "mean_loss", "train_mean_loss",
              "train/mean_loss", "avg_loss", "train_avg_loss",  # a total under the name of how it is reduced
              "loss_total", "train/loss_total", "train_loss_total", "train/loss_total_step")  # (Lightning's _step)
LR_NAMES = ("lr", "learning_rate", "train/lr", "train/learning_rate", "lr-adamw", "lr-adam", "lr-sgd",
            "lr/pg0", "x/lr0", "learning-rate")  # x/lr0: YOLOv5's results.csv
GRAD_NAMES = ("grad_norm", "gradient_norm", "train/grad_norm", "grad-norm", "gnorm", "grad norm")
STEP_NAMES = ("step", "global_step", "iteration", "iter", "it", "train/global_step", "trainer/global_step",
              "current_steps", "_step")  # LLaMA-Factory's trainer_log.jsonl; W&B history exports
EVAL_PREFIXES = ("eval_", "eval/", "val_", "val/", "valid_", "validation_", "validation/", "test_", "test/",
                 "dev_", "evaluation_", "metrics/")


# A reader's event that another launch of the script begins in the same file (a relaunch appended to the log,
# a fit run again): `diagnose` judges the last launch that trains (`launch_event`).
EVENT_LAUNCH = "launch"


def launch_event(step: int | None, why: str) -> dict[str, Any]:
    return event(EVENT_LAUNCH, step, {"why": why})


@dataclass
class Facts:
    """What a reader learned besides the metrics: filled while its events are read."""

    traceback: list[str] | None = None  # the lines of the last traceback
    completed: str | None = None  # the line (or key) that says the run finished
    warnings: list[tuple[int, str]] = field(default_factory=list)  # (line number, text) of PyTorch warnings
    last_line: str | None = None
    last_word: str | None = None  # the last line that says something (not a stray `50` or `---` after the end)
    lines: int = 0  # lines (or rows, records) read; a text log's \r-separated redraws count
    newlines: int = 0  # newline-ended lines of a text log
    mtime: float | None = None  # when the file was last written
    steps: int = 0
    evals: int = 0
    fields: set[str] = field(default_factory=set)  # step-row fields that carried a number at least once
    skipped: int = 0  # lines or rows that could not be read
    launch_error: str | None = None  # argparse's `error:` line: the command was refused before training
    snapshot: str | None = None  # what a file written mid-run (a checkpoint's trainer_state.json) is a snapshot of
    # what the last metric line was: "step", "eval" or "summary" (an epoch's end); "unknown": the format
    # cannot show how the run ended (a Lightning CSV with no epoch-end rows and no planned epochs)
    ends_with: str | None = None
    # the failures the output printed without a traceback (a CUDA error, the OOM killer, a scheduler's cut)
    signs: Scanner = field(default_factory=Scanner)
    # where the run stood against the plan its log states, when it ended short of it ("epoch 17 of 200 (8%)")
    cut_off: str | None = None


@dataclass
class Source:
    """One thing to diagnose: what it is, the plan it states, its events (read lazily), its facts."""

    path: Path
    format: str
    events: Any  # an iterator of event dicts; read it once
    plan: dict[str, Any] = field(default_factory=dict)
    facts: Facts = field(default_factory=Facts)
    log_like: bool = False  # a process's output: its end (or lack of one) means something


def to_number(value: Any) -> float | None:
    """A metric value as a float ("nan", "inf" included), None when it is not a number."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, float):
        return value
    if isinstance(value, int):
        try:
            return float(value)
        except OverflowError:  # an integer of hundreds of digits (JSON allows it): past any float
            return float("inf") if value > 0 else float("-inf")
    if isinstance(value, str):
        text = value.strip().rstrip(",;")
        if not text or len(text) > 40:
            return None
        try:
            return float(text)
        except ValueError:
            return None
    return None


def step_row(step: int, *, t: float | None = None, loss: float | None = None, lr: float | None = None,
             grad_norm: float | None = None, parts: dict[str, float] | None = None,
             extra: dict[str, Any] | None = None, weights: dict[str, float] | None = None) -> dict[str, Any]:
    nonfinite = None
    if grad_norm is not None:
        nonfinite = 0 if math.isfinite(grad_norm) else 1
    return {"kind": "step", "step": step, "t": t, "loss": loss, "lr": lr, "grad_norm": grad_norm,
            "update_ratio": None, "nonfinite": nonfinite, "step_time": None, "data_wait": None,
            "loss_scale": None, "sched_epoch": None, "parts": parts or {}, "weights": weights or {},
            "extra": extra or {}, "rank": 0}


def event(kind: str, step: int | None, data: dict[str, Any], *, name: str | None = None,
          t: float | None = None) -> dict[str, Any]:
    return {"kind": kind, "name": name, "step": step, "t": t, "data": data}


def is_eval_name(name: str) -> bool:
    low = name.lower()
    return low.startswith(EVAL_PREFIXES) or low in ("val", "eval")


def metrics_to_events(step: int, metrics: dict[str, float], facts: Facts, *, t: float | None = None,
                      parts_from: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """One step's named metrics → a step row (train metrics) and an eval event (eval metrics).

    `parts_from`: name prefixes whose values are loss parts (Ultralytics' `train/box_loss`...); when
    there is no total loss the parts' sum stands for it, as the framework's own total does.
    """
    loss_key, lr_key, grad_key, eval_keys, part_keys, weight_keys = _layout(tuple(metrics), parts_from)
    out: list[dict[str, Any]] = []
    loss = metrics[loss_key] if loss_key is not None else None
    lr = metrics[lr_key] if lr_key is not None else None
    grad = metrics[grad_key] if grad_key is not None else None
    parts = {short: metrics[name] for name, short in part_keys}
    weights = {short: metrics[name] for name, short in weight_keys}
    if loss is None and parts:
        loss = sum(parts.values())
    if loss is not None or lr is not None or grad is not None:
        out.append(step_row(step, t=t, loss=loss, lr=lr, grad_norm=grad, parts=parts, weights=weights))
        if weights:
            facts.fields.add("weights")
        if loss is not None:
            facts.fields.add("loss")
        if lr is not None:
            facts.fields.add("lr")
        if grad is not None:
            facts.fields.add("grad_norm")
        if parts:
            facts.fields.add("parts")
        facts.steps += 1
    if eval_keys:
        facts.evals += 1
        facts.fields.add("eval")
        out.append(event("eval", step, {short: metrics[name] for name, short in eval_keys}, t=t))
    return out


@functools.lru_cache(maxsize=1024)
def _layout(names: tuple[str, ...], parts_from: tuple[str, ...]) -> tuple[Any, ...]:
    """Which of a step's metric names is the loss, the LR, the grad norm, an eval metric, a loss part.

    Cached: a log repeats the same few sets of names millions of times.
    """
    train: dict[str, str] = {}  # lower-cased name -> name
    evals: list[tuple[str, str]] = []
    for name in names:
        if is_eval_name(name):
            key = name.split("/", 1)[1] if "/" in name else name.split("_", 1)[1] if "_" in name else name
            evals.append((name, key or name))
        else:
            train.setdefault(name.lower(), name)
    lr = _first(train, LR_NAMES)
    if lr is None:
        lr = next((v for k, v in train.items() if k.startswith(("lr-", "lr/", "lr_"))), None)
    parts = tuple((v, k.split("/", 1)[-1]) for k, v in train.items()
                  if parts_from and (k.startswith(parts_from) or k.endswith(parts_from)))
    return _first(train, LOSS_NAMES), lr, _first(train, GRAD_NAMES), tuple(evals), parts, _weights(train, parts)


def _weights(train: dict[str, str], parts: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    """A part's weight where the log writes it beside the part: `w_kd` / `w_loss_kd` / `weight_kd` /
    `kd_weight` / `lambda_kd` for `loss_kd` (a curriculum's ramp, read where it is written)."""
    out = []
    for _, short in parts:
        low = short.lower()
        stem = low.removeprefix("loss_").removesuffix("_loss")
        for cand in (f"w_{low}", f"w_{stem}", f"weight_{stem}", f"{stem}_weight", f"lambda_{stem}"):
            if cand in train:
                out.append((train[cand], short))
                break
    return tuple(out)


def _first(values: dict[str, str], names: tuple[str, ...]) -> str | None:
    for name in names:
        if name in values:
            return values[name]
    return None


_NUL_RUNS = re.compile(rb"\x00+")


def sniff_binary(head: bytes, path: Path) -> None:
    """Refuses what is not text: NUL bytes, or mostly bytes that no text encoding uses."""
    if not head:
        return
    if b"\x00" in head:
        # A log truncated while its writer kept its offset (`> train.log` under a running job, a copy taken
        # mid-write) holds a hole of NUL bytes: a few long runs, text around them. A binary file's NULs are
        # many short runs among its other control bytes.
        runs = _NUL_RUNS.findall(head)
        text = _NUL_RUNS.sub(b"", head)
        if len(runs) > 8 or len(text) < 64:
            raise UserError(f"{path} is a binary file, not a log or a metrics file")
        head = text
    control = sum(1 for b in head if b < 32 and b not in (9, 10, 13, 27, 8, 12))
    if control > len(head) * 0.05:
        raise UserError(f"{path} does not look like text ({control} control bytes in its first {len(head)})")


def sniff_binary_ok(path: Path) -> None:
    """A binary format (TensorBoard records) must at least not be empty."""
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror or exc}") from None
    if size == 0:
        raise UserError(f"{path} is empty")
