"""Metrics files with one row per logged step: CSV (Lightning's metrics.csv, Ultralytics' results.csv,
any CSV with a step column) and JSON Lines (one object per line with a step key).

Rows are read one at a time. Lightning writes train and validation metrics on separate, sparse rows of
the same step; rows are merged per step before they become events, so a step is one event.
"""

from __future__ import annotations

import csv
import functools
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from trainguard.errors import UserError
from trainguard.ingest.events import (
    LOSS_NAMES,
    STEP_NAMES,
    Facts,
    Source,
    is_eval_name,
    launch_event,
    metrics_to_events,
    sniff_binary,
    to_number,
)
from trainguard.ingest.textlog import MAX_LINE
from trainguard.untrusted import load_json


def read_csv(path: Path, fmt: str = "csv", delimiter: str = ",") -> Source:
    """A CSV with a header naming a step (or epoch) column; `fmt` names the flavour for the report.

    `delimiter`: "\t" for a step/loss TSV. The flavour's contract (`trainguard.ingest.formats`) says where
    its plan is written and how its end reads: a Lightning metrics.csv by its epoch-end rows, a table of
    one row per epoch (Ultralytics, YOLOv5, timm) by its planned epochs, early stopping and its LR schedule.
    """
    from trainguard.ingest import epochend, formats
    from trainguard.ingest.plans import read_plan

    header = _header(path, delimiter)
    low = [h.strip().lower() for h in header]
    step_col = next((h for h, lo in zip(header, low) if lo in STEP_NAMES), None)
    epoch_col = next((h for h, lo in zip(header, low) if lo == "epoch"), None)
    history = step_col is None and epoch_col is None and _keras_history(low)
    if step_col is None and epoch_col is None and not history:
        raise UserError(f"{path}: a CSV without a step or epoch column ({', '.join(header[:8])}...): "
                        "not a metrics file trainguard can read")
    fmt = "keras history csv" if history else flavour(fmt, path.name, low)
    contract = formats.contract(fmt)
    facts = Facts(mtime=path.stat().st_mtime)
    parts = contract.parts_from if contract is not None else ()
    key = step_col or epoch_col or "epoch"
    rows = _csv_rows(path, facts, delimiter)
    if history:
        # `pd.DataFrame(history.history).to_csv()`: one row per epoch in order, the row's index is its epoch
        rows = ({**row, "epoch": str(i)} for i, row in enumerate(rows))
    plan: dict[str, Any] = {"parts_relation": contract.parts} if contract is not None else {}
    log_like = False
    if contract is not None and contract.step_unit == "epoch":
        plan["step_unit"] = "epoch"
    if fmt == "lightning metrics.csv" and epoch_col is not None and step_col is not None:
        log_like = True
        epoch_loss = _epoch_only_loss(header)
        if epoch_loss is not None:
            # `self.log("train_loss", ..., on_step=False, on_epoch=True)`: only the epoch's mean is written,
            # under `<name>_epoch`; it is the run's loss curve, one row per epoch
            rows = ({**row, epoch_loss[:-6]: row.get(epoch_loss)} for row in rows)
            plan["step_unit"] = "epoch"
        elif _loss_per_epoch(path, delimiter, epoch_col):
            plan["step_unit"] = "epoch"
        stated = read_plan(path.parent, contract)
        rows = _lightning_end(rows, epoch_col, step_col, facts, stated.length)
    elif contract is not None and contract.step_unit == "epoch" and epoch_col is not None and contract.plan_files:
        log_like = True
        stated = read_plan(path.parent, contract)
        if stated.length:
            plan["total_steps"] = stated.length
        rows = epochend.judge(rows, epoch_col, facts, stated, lr_schedule=fmt in ("ultralytics results.csv", "yolov5 results.csv"))
    return Source(path=path, format=fmt, events=merged(rows, key, facts, parts), facts=facts, plan=plan,
                  log_like=log_like)


def _loss_per_epoch(path: Path, delimiter: str, epoch_col: str) -> bool:
    """Whether the table's loss is written once per epoch (Lightning's `self.log(..., on_epoch=True)`
    only): one pass over the rows before the events, counting epochs and rows with a loss."""
    epochs: set[str] = set()
    with_loss = 0
    for row in _csv_rows(path, Facts(), delimiter):
        epochs.add(str(row.get(epoch_col)))
        if any(str(k).strip().lower() in LOSS_NAMES and to_number(v) is not None for k, v in row.items()):
            with_loss += 1
        if with_loss > len(epochs) + 1:
            return False
    return len(epochs) >= 2 and with_loss > 0


def _epoch_only_loss(header: list[str]) -> str | None:
    """Lightning's `<loss>_epoch` column (`train_loss_epoch`) where the table has no step-level loss column."""
    low = [h.strip().lower() for h in header]
    if any(h in LOSS_NAMES for h in low):
        return None
    return next((h for h, lo in zip(header, low) if lo.endswith("_epoch") and lo[:-6] in LOSS_NAMES), None)


def _keras_history(low: list[str]) -> bool:
    """A Keras `History.history` saved as a table (no epoch column): a `loss` column, and each `val_<m>` column
    beside its `<m>` (the names Keras gives a metric on the validation data); a pandas index column may lead."""
    names = [n for n in low if n and n != "unnamed: 0"]
    vals = [n for n in names if n.startswith("val_")]
    return "loss" in names and bool(vals) and all(n[4:] in names for n in vals)


def flavour(fmt: str, name: str, low: list[str]) -> str:
    """The writer of a table, from its file name and header, as its contract names it."""
    if fmt == "ultralytics results.csv" and ("x/lr0" in low or "train/obj_loss" in low):
        return "yolov5 results.csv"  # YOLOv5 pads its columns, counts epochs from 0, keeps opt.yaml
    if fmt != "csv":
        return fmt
    if name.lower() == "summary.csv" and "train_loss" in low and any(c.startswith("eval_") for c in low):
        return "timm summary.csv"
    # Keras' CSVLogger writes `epoch`, then the epoch's logs sorted by name
    if low and low[0] == "epoch" and "loss" in low and low[1:] == sorted(low[1:]):
        return "keras csvlogger"
    return fmt


def sniff_table(path: Path) -> str | None:
    """The delimiter of a table written under a log's name (`train.log` holding `step<TAB>loss` rows), if it is one."""
    with open(path, "rb") as f:
        head = f.read(4096).decode("utf-8", "replace")
    lines = [line for line in re.split(r"[\r\n]+", head) if line.strip()][:2]
    if len(lines) < 2:
        return None
    for delimiter in ("\t", ","):
        names, cells = lines[0].strip("\ufeff ").split(delimiter), lines[1].split(delimiter)
        if len(names) < 2 or len(names) != len(cells):
            continue
        if any(to_number(n) is not None for n in names) or any(to_number(c) is None for c in cells):
            continue
        if any(n.strip().lower() in STEP_NAMES or n.strip().lower() == "epoch" for n in names):
            return delimiter
    return None


def _lightning_end(rows: Iterable[dict[str, Any]], epoch_col: str, step_col: str, facts: Facts,
                   planned: int | None) -> Iterator[dict[str, Any]]:
    """Passes the rows on, noting which epochs closed (an `*_epoch` or validation value in them).

    CSVLogger flushes its rows every `flush_logs_every_n_steps` and at the end of `fit`, so a file that
    ends on an epoch-end row says nothing of whether training was over: a killed run ends there as often.
    What does say it: `trainer.test()` rows after the last epoch (`fit` returned), or the last epoch
    `hparams.yaml` plans. Its last epoch closed short of the plan: EarlyStopping (it prints only to the
    console) or a kill, which the file cannot tell apart (info); the last epoch did not close but
    earlier ones did: a `max_steps` limit or a kill (info). No epoch ever closed although `hparams.yaml`
    plans some: the run stopped inside its first epoch (a warning). No plan and no test: unknown.
    """
    closed: set[int] = set()
    epoch = step = None
    tested = False  # a `test_*` value after the fit's rows: trainer.test() ran, so fit() returned
    for row in rows:
        e, s = to_number(row.get(epoch_col)), to_number(row.get(step_col))
        if e is not None and abs(e) < 1e15:  # also false for NaN
            epoch = int(e)
        if s is not None and abs(s) < 1e15:
            step = int(s)
        values = [str(k) for k, v in row.items() if to_number(v) is not None]
        if any(k.startswith("test") for k in values):
            tested = True
        elif epoch is not None and epoch not in closed and any(k.endswith("_epoch") or is_eval_name(k) for k in values):
            closed.add(epoch)
            tested = False
        yield row
    if epoch is None:
        return
    last = max(closed) if closed else None
    if tested and closed:
        facts.completed = f"test rows after its last epoch ({last}): trainer.test() ran, so fit() returned"
    elif last is not None and planned and last + 1 >= planned:
        facts.completed = f"its last epoch ({last}) is the last of the {planned} hparams.yaml plans"
    elif last is not None and last == epoch and planned:
        facts.ends_with = "summary"
        facts.last_line = (f"epoch {last} of the {planned} hparams.yaml plans closed, then nothing: EarlyStopping "
                           "(it says so only on the console) or a kill")
    elif closed and last != epoch:
        facts.ends_with = "summary"
        facts.last_line = (f"epoch {epoch}, step {step}, after epochs up to {last} closed: a max_steps "
                           "limit or a kill")
    elif planned and not closed:
        facts.ends_with = "step"
        facts.last_line = (f"epoch {epoch}, step {step}: not one of the {planned} epochs hparams.yaml plans "
                           "closed (Lightning writes an epoch-end row when an epoch closes)")
    else:
        facts.ends_with = "unknown"  # nothing in Lightning's own files says how the run was meant to end


def read_jsonl(path: Path) -> Source:
    """JSON Lines, read by the contract of its writer when its first record names one: LLaMA-Factory's
    `trainer_log.jsonl` and ms-swift's `logging.jsonl` (their plan and end), detectron2's `metrics.json`
    (windowed medians, an ETA), mmengine's `scalars.json` (two step axes); else by key names alone."""
    from trainguard.ingest import detectron2, formats, mmengine

    facts = Facts(mtime=path.stat().st_mtime)
    first = _first_record(path)
    fmt = jsonl_flavour(path.name, first)
    contract = formats.contract(fmt)
    plan: dict[str, Any] = {"parts_relation": contract.parts} if contract is not None else {}
    rows: Iterable[dict[str, Any]] = _json_rows(path, facts)
    log_like = False
    if fmt == "mmcv log.json":
        from trainguard.ingest import mmcv

        rows, log_like = mmcv.rows(rows, facts, mmcv.plan_of(first or {})), True
    elif fmt == "detectron2 metrics.json":
        rows, log_like = detectron2.rows(rows, facts), True
    elif fmt == "mmengine scalars.json":
        stated = mmengine.plan(path.parent, contract)
        if stated.length and stated.length_key and "iters" in stated.length_key:
            plan["total_steps"] = stated.length
        rows, log_like = mmengine.rows(rows, facts, stated), True
    else:
        total = _total_of(first) or (_summary_step(path) if fmt == "ms-swift logging.jsonl" else None)
        if total:
            plan["total_steps"] = total
            rows, log_like = _reaches(rows, total, facts, closing=fmt == "llama-factory trainer_log.jsonl"), True
        elif fmt == "llama-factory trainer_log.jsonl":
            fmt = "json lines"
    parts = contract.parts_from if contract is not None else ()
    return Source(path=path, format=fmt, events=merged(_summaries(rows, facts), None, facts, parts), plan=plan,
                  facts=facts, log_like=log_like)


def jsonl_flavour(name: str, first: dict[str, Any] | None) -> str:
    """The writer of a JSON Lines file, from its first record's keys (each writer's own)."""
    if not first:
        return "json lines"
    if "global_step/max_steps" in first or ("global_step" in first and "train_speed(iter/s)" in first):
        return "ms-swift logging.jsonl"
    if "current_steps" in first and "total_steps" in first:
        return "llama-factory trainer_log.jsonl"
    from trainguard.ingest import mmcv

    if mmcv.is_log_json(name, first):
        return "mmcv log.json"
    if "iteration" in first and ("eta_seconds" in first or "data_time" in first or "total_loss" in first):
        return "detectron2 metrics.json"
    if name.lower() == "scalars.json" and "step" in first and ("iter" in first or "epoch" in first):
        return "mmengine scalars.json"
    return "json lines"


def _first_record(path: Path) -> dict[str, Any] | None:
    with open(path, "rb") as f:
        first = f.readline(MAX_LINE).decode("utf-8", "replace")
    try:
        obj = load_json(first)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def _total_of(first: dict[str, Any] | None) -> int | None:
    if not first:
        return None
    total = to_number(first.get("total_steps"))
    if total is None and (of_max := _of_max(first)) is not None:
        total = of_max[1]
    return int(total) if total is not None and 0 < total < 1e15 else None


SUMMARY_TAIL = 4 << 20  # bytes of a log's end searched for its closing summary


def _summary_step(path: Path) -> int | None:
    """The step of the `train_runtime` summary a finished Trainer-based run writes last (ms-swift's older
    files state no max_steps anywhere else): a finished run's own end is its plan."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - SUMMARY_TAIL))
            tail = f.read(SUMMARY_TAIL)
    except OSError:
        return None
    for raw in reversed(tail.splitlines()):
        if b'"train_runtime"' not in raw[:4096] or len(raw) > MAX_LINE:
            continue
        try:
            obj = load_json(raw.decode("utf-8", "replace"))
        except ValueError:
            continue
        if isinstance(obj, dict) and "train_runtime" in obj:
            step = _step_of(obj, None)
            return step if step and step > 0 else None
    return None


def _summaries(rows: Iterable[dict[str, Any]], facts: Facts) -> Iterator[dict[str, Any]]:
    """Drops the Trainer's closing summary (`train_runtime`, a whole-run mean `train_loss`), noting the
    end it marks: its loss is no step's loss."""
    for row in rows:
        if "train_runtime" in row:
            facts.completed = facts.completed or "the closing train_runtime summary"
            continue
        yield row


def _of_max(row: dict[str, Any]) -> tuple[int, int] | None:
    """ms-swift's `"global_step/max_steps": "10/500"`."""
    value = row.get("global_step/max_steps")
    if not isinstance(value, str) or "/" not in value:
        return None
    n, _, total = value.partition("/")
    if not (n.strip().isdigit() and total.strip().isdigit()) or len(value) > 40:
        return None
    return int(n), int(total)


# what LogCallback.on_log copies from a log_history row (None values dropped): a record with none of them is
# the closing `train()` summary (train_runtime, train_loss), which the Trainer logs once training returned
_LF_VALUES = ("loss", "eval_loss", "predict_loss", "reward", "accuracy", "lr", "learning_rate")


def _reaches(rows: Iterable[dict[str, Any]], total: int, facts: Facts, *, closing: bool = False) -> Iterator[dict[str, Any]]:
    last = 0
    summary: int | None = None  # the step of a closing summary record, while it is the last record
    for row in rows:
        step = _step_of(row, None)
        last = max(last, step or 0)
        summary = (step or last) if closing and step is not None and not any(k in row for k in _LF_VALUES) else None
        yield row
    if last >= total:
        facts.completed = f"current_steps reaches total_steps ({total:,})"
    elif summary is not None:
        # total_steps is max_steps as the Trainer planned it, which may be one more than the steps it ran
        facts.completed = f"the closing train() summary record at step {summary:,} of {total:,}"
    else:
        facts.ends_with = "step"


def _header(path: Path, delimiter: str = ",") -> list[str]:
    with open(path, "rb") as f:
        head = f.read(8192)
    sniff_binary(head, path)
    first = re.split(rb"[\r\n]", head, maxsplit=1)[0].decode("utf-8", "replace").strip("\ufeff ")
    if not first or delimiter not in first:
        raise UserError(f"{path}: no CSV header on its first line")
    return next(csv.reader([first], delimiter=delimiter))


def _csv_rows(path: Path, facts: Facts, delimiter: str = ",") -> Iterator[dict[str, Any]]:
    with open(path, "rb") as raw:
        reader = csv.reader(_bounded(raw, facts), delimiter=delimiter)
        try:
            header = [h.strip().lstrip("\ufeff") for h in next(reader, [])]
        except csv.Error:
            return
        while True:
            try:
                cells = next(reader)
            except StopIteration:
                return
            except csv.Error:  # a damaged row (a stray quote, a NUL): skipped, the next one is read
                facts.skipped += 1
                continue
            facts.lines += 1
            if len(cells) != len(header):
                facts.skipped += 1  # a truncated last row, or a row from another header
                continue
            yield dict(zip(header, cells))


def _bounded(raw: Any, facts: Facts) -> Iterator[str]:
    """Decoded lines of a binary file, read at most MAX_LINE bytes at a time: a longer line is skipped
    (counted) without ever being held whole (iterating a text wrapper held a 600 MB line, twice)."""
    while True:
        line = raw.readline(MAX_LINE + 1)
        if not line:
            return
        if len(line) > MAX_LINE and not line.endswith(b"\n"):
            facts.skipped += 1
            while line and not line.endswith(b"\n"):
                line = raw.readline(1 << 20)
            continue
        yield line.decode("utf-8", "replace").replace("\x00", "")


def _json_rows(path: Path, facts: Facts) -> Iterator[dict[str, Any]]:
    with open(path, "rb") as raw:
        sniff_binary(raw.read(8192), path)
        raw.seek(0)
        for line in _bounded(raw, facts):
            facts.lines += 1
            line = line.strip()
            if not line:
                continue
            try:
                obj = load_json(line)
            except ValueError:  # malformed, nested too deep, a number too long
                facts.skipped += 1
                continue
            if isinstance(obj, dict):
                yield obj
            else:
                facts.skipped += 1


def merged(rows: Iterable[dict[str, Any]], key: str | None, facts: Facts,
            parts: tuple[str, ...]) -> Iterator[dict[str, Any]]:
    """Rows → events, rows of the same step merged (Lightning writes one row per logging call).

    A row back at the table's first step after later ones is another launch appended to the same file (Keras'
    `CSVLogger(append=True)` over a second `fit`, a script run again): a `launch` event goes before it. A
    resumed run's rows go on from a later step and are no new launch."""
    current: int | None = None
    merged: dict[str, float] = {}
    first: tuple[float, int] | None = None
    advanced = False
    for row in rows:
        step = _step_of(row, key)
        if step is None:
            facts.skipped += 1
            continue
        # the position, with the row's epoch when the table has one beside its step (a step counted within
        # the epoch restarts at each epoch: no launch)
        epoch = to_number(row.get("epoch")) if key != "epoch" else None
        pos = (epoch if epoch is not None and epoch == epoch else -1.0, step)
        if current is not None and step != current:
            yield from metrics_to_events(current, merged, facts, parts_from=parts or _loss_parts(tuple(merged)))
            merged = {}
            if first is not None and pos <= first and advanced:
                yield launch_event(current, "the step column is back at its first value")
                advanced = False
        if first is None:
            first = pos
        elif pos > first:
            advanced = True
        current = step
        for name, value in row.items():
            if name is None or name == key or str(name).lower() in STEP_NAMES:
                continue
            number = to_number(value)
            if number is not None and str(name).lower() not in ("epoch", "total_steps", "percentage"):
                merged[str(name)] = number
    if current is not None:
        yield from metrics_to_events(current, merged, facts, parts_from=parts or _loss_parts(tuple(merged)))


@functools.lru_cache(maxsize=256)
def _loss_parts(names: tuple[str, ...]) -> tuple[str, ...]:
    """Columns that are parts of a total loss logged beside them (`loss_kd`, `loss_lm`; detectron2's
    `loss_cls` beside `total_loss`): only when there is a total, so a lone `val_loss` stays an evaluation."""
    low = {n.lower() for n in names}
    if not low & set(LOSS_NAMES):
        return ()
    return tuple(n for n in names if not is_eval_name(n) and n.lower() not in LOSS_NAMES
                 and (n.lower().startswith("loss_") or n.lower().endswith("_loss")))


def _step_of(row: dict[str, Any], key: str | None) -> int | None:
    names = [key] if key else [k for k in row if str(k).lower() in STEP_NAMES]
    if not names and (of_max := _of_max(row)) is not None:
        return of_max[0]
    for name in names:
        value = to_number(row.get(name))
        if value is not None and value == value and abs(value) < 1e15:
            return int(value)
    return None
