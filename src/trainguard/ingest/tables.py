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
    if step_col is None and epoch_col is None:
        raise UserError(f"{path}: a CSV without a step or epoch column ({', '.join(header[:8])}...): "
                        "not a metrics file trainguard can read")
    fmt = flavour(fmt, path.name, low)
    contract = formats.contract(fmt)
    facts = Facts(mtime=path.stat().st_mtime)
    parts = contract.parts_from if contract is not None else ()
    key = step_col or epoch_col
    rows = _csv_rows(path, facts, delimiter)
    plan: dict[str, Any] = {"parts_relation": contract.parts} if contract is not None else {}
    log_like = False
    if fmt == "lightning metrics.csv" and epoch_col is not None and step_col is not None:
        log_like = True
        stated = read_plan(path.parent, contract)
        rows = _lightning_end(rows, epoch_col, step_col, facts, stated.length)
    elif contract is not None and contract.step_unit == "epoch" and epoch_col is not None and contract.plan_files:
        log_like = True
        stated = read_plan(path.parent, contract)
        if stated.length:
            plan["total_steps"] = stated.length
        rows = epochend.judge(rows, epoch_col, facts, stated, lr_schedule=fmt in ("ultralytics results.csv", "yolov5 results.csv"))
    return Source(path=path, format=fmt, events=_merged(rows, key, facts, parts), facts=facts, plan=plan,
                  log_like=log_like)


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

    The last epoch closed: the run ended at an epoch's end. It did not, but earlier ones did: a
    `max_steps` limit or a kill, which the file cannot tell apart (info). No epoch ever closed although
    `hparams.yaml` plans `planned` of them: the run stopped inside its first epoch (a warning).
    """
    closed: set[int] = set()
    epoch = step = None
    for row in rows:
        e, s = to_number(row.get(epoch_col)), to_number(row.get(step_col))
        if e is not None and abs(e) < 1e15:  # also false for NaN
            epoch = int(e)
        if s is not None and abs(s) < 1e15:
            step = int(s)
        if epoch is not None and epoch not in closed and any(
                (str(k).endswith("_epoch") or is_eval_name(str(k))) and to_number(v) is not None for k, v in row.items()):
            closed.add(epoch)
        yield row
    if epoch is None:
        return
    if epoch in closed:
        facts.completed = f"its last epoch ({epoch}) ends with the epoch-end row Lightning writes when an epoch closes"
    elif closed:
        facts.ends_with = "summary"
        facts.last_line = (f"epoch {epoch}, step {step}, after epochs up to {max(closed)} closed: a max_steps "
                           "limit or a kill")
    elif planned:
        facts.ends_with = "step"
        facts.last_line = (f"epoch {epoch}, step {step}: not one of the {planned} epochs hparams.yaml plans "
                           "closed (Lightning writes an epoch-end row when an epoch closes)")
    else:
        facts.ends_with = "unknown"  # nothing in Lightning's own files says how the run was meant to end


def read_jsonl(path: Path) -> Source:
    """JSON Lines; LLaMA-Factory's `trainer_log.jsonl` (`current_steps` of `total_steps`) states its plan."""
    facts = Facts(mtime=path.stat().st_mtime)
    total = _peek_total(path)
    plan = {"total_steps": total} if total else {}
    rows = _json_rows(path, facts)
    if total:
        rows = _reaches(rows, total, facts)
    fmt = ("ms-swift logging.jsonl" if "global_step/max_steps" in _first_line(path) else
           "llama-factory trainer_log.jsonl") if total else "json lines"
    return Source(path=path, format=fmt, events=_merged(rows, None, facts, ()), plan=plan, facts=facts,
                  log_like=bool(total))


def _first_line(path: Path) -> str:
    with open(path, "rb") as f:
        return f.readline(MAX_LINE).decode("utf-8", "replace")


def _peek_total(path: Path) -> int | None:
    first = _first_line(path)
    try:
        obj = load_json(first)
    except ValueError:
        return None
    if not isinstance(obj, dict):
        return None
    total = to_number(obj.get("total_steps"))
    if total is None and (of_max := _of_max(obj)) is not None:
        total = of_max[1]
    return int(total) if total is not None and 0 < total < 1e15 else None


def _of_max(row: dict[str, Any]) -> tuple[int, int] | None:
    """ms-swift's `"global_step/max_steps": "10/500"`."""
    value = row.get("global_step/max_steps")
    if not isinstance(value, str) or "/" not in value:
        return None
    n, _, total = value.partition("/")
    if not (n.strip().isdigit() and total.strip().isdigit()) or len(value) > 40:
        return None
    return int(n), int(total)


def _reaches(rows: Iterable[dict[str, Any]], total: int, facts: Facts) -> Iterator[dict[str, Any]]:
    last = 0
    for row in rows:
        step = _step_of(row, None)
        last = max(last, step or 0)
        yield row
    if last >= total:
        facts.completed = f"current_steps reaches total_steps ({total:,})"
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


def _merged(rows: Iterable[dict[str, Any]], key: str | None, facts: Facts,
            parts: tuple[str, ...]) -> Iterator[dict[str, Any]]:
    """Rows → events, rows of the same step merged (Lightning writes one row per logging call)."""
    current: int | None = None
    merged: dict[str, float] = {}
    for row in rows:
        step = _step_of(row, key)
        if step is None:
            facts.skipped += 1
            continue
        if current is not None and step != current:
            yield from metrics_to_events(current, merged, facts, parts_from=parts or _loss_parts(tuple(merged)))
            merged = {}
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
