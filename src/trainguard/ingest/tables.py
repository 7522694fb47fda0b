"""Metrics files with one row per logged step: CSV (Lightning's metrics.csv, Ultralytics' results.csv,
any CSV with a step column) and JSON Lines (one object per line with a step key).

Rows are read one at a time. Lightning writes train and validation metrics on separate, sparse rows of
the same step; rows are merged per step before they become events, so a step is one event.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from trainguard.errors import UserError
from trainguard.ingest.events import STEP_NAMES, Facts, Source, metrics_to_events, sniff_binary, to_number
from trainguard.ingest.textlog import MAX_LINE
from trainguard.untrusted import load_json

ULTRALYTICS_PARTS = ("train/",)  # results.csv: train/box_loss, train/cls_loss, train/dfl_loss


def read_csv(path: Path, fmt: str = "csv") -> Source:
    """A CSV with a header naming a step (or epoch) column; `fmt` names the flavour for the report."""
    header = _header(path)
    low = [h.strip().lower() for h in header]
    step_col = next((h for h, lo in zip(header, low) if lo in STEP_NAMES), None)
    epoch_col = next((h for h, lo in zip(header, low) if lo == "epoch"), None)
    if step_col is None and epoch_col is None:
        raise UserError(f"{path}: a CSV without a step or epoch column ({', '.join(header[:8])}...): "
                        "not a metrics file trainguard can read")
    facts = Facts(mtime=path.stat().st_mtime)
    parts = ULTRALYTICS_PARTS if fmt == "ultralytics results.csv" else ()
    key = step_col or epoch_col
    rows = _csv_rows(path, facts)
    return Source(path=path, format=fmt, events=_merged(rows, key, facts, parts), facts=facts)


def read_jsonl(path: Path) -> Source:
    facts = Facts(mtime=path.stat().st_mtime)
    return Source(path=path, format="json lines", events=_merged(_json_rows(path, facts), None, facts, ()),
                  facts=facts)


def _header(path: Path) -> list[str]:
    with open(path, "rb") as f:
        head = f.read(8192)
    sniff_binary(head, path)
    first = re.split(rb"[\r\n]", head, maxsplit=1)[0].decode("utf-8", "replace").strip("\ufeff ")
    if not first or "," not in first:
        raise UserError(f"{path}: no CSV header on its first line")
    return next(csv.reader([first]))


def _csv_rows(path: Path, facts: Facts) -> Iterator[dict[str, Any]]:
    with open(path, "rb") as raw:
        text = io.TextIOWrapper(raw, encoding="utf-8", errors="replace", newline="")
        reader = csv.reader(_bounded(text, facts))
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


def _bounded(lines: Iterable[str], facts: Facts) -> Iterator[str]:
    for line in lines:
        if len(line) > MAX_LINE:
            facts.skipped += 1
            continue
        yield line.replace("\x00", "")


def _json_rows(path: Path, facts: Facts) -> Iterator[dict[str, Any]]:
    with open(path, "rb") as raw:
        sniff_binary(raw.read(8192), path)
        raw.seek(0)
        text = io.TextIOWrapper(raw, encoding="utf-8", errors="replace")
        for line in _bounded(text, facts):
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
            yield from metrics_to_events(current, merged, facts, parts_from=parts)
            merged = {}
        current = step
        for name, value in row.items():
            if name is None or name == key or str(name).lower() in STEP_NAMES:
                continue
            number = to_number(value)
            if number is not None and str(name).lower() != "epoch":
                merged[str(name)] = number
    if current is not None:
        yield from metrics_to_events(current, merged, facts, parts_from=parts)


def _step_of(row: dict[str, Any], key: str | None) -> int | None:
    names = [key] if key else [k for k in row if str(k).lower() in STEP_NAMES]
    for name in names:
        value = to_number(row.get(name))
        if value is not None and value == value and abs(value) < 1e15:
            return int(value)
    return None
