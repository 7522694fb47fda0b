"""YOLOv7's (YOLOR's, early YOLOv5's) `results.txt`: one whitespace-separated row per epoch, no header.

The columns are the contract's (`formats/yolov7.py`, from the code that writes them): the first field is
`epoch/(epochs - 1)`, so every row states the plan; `opt.yaml` beside it says the same when the rows cannot.
The end is judged as for the other one-row-per-epoch tables (`epochend`): the last planned epoch, or cut off.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trainguard.ingest.events import Facts, Source, sniff_binary, to_number

FORMAT = "yolov7 results.txt"
_EPOCH = re.compile(r"^(\d{1,9})/(\d{1,9})$")
PEEK_LINES = 5


def looks_like(path: Path) -> bool:
    """Whether a results.txt is the YOLO table: its first rows have the contract's field count and `e/N` first."""
    from trainguard.ingest.formats.yolov7 import COLUMNS

    try:
        with open(path, "rb") as f:
            head = f.read(8192).decode("utf-8", "replace").splitlines()[:PEEK_LINES]
    except OSError:
        return False
    rows = [line.split() for line in head if line.strip()]
    return bool(rows) and all(len(r) == len(COLUMNS) and _EPOCH.match(r[0]) for r in rows)


def read_results_txt(path: Path) -> Source:
    from trainguard.ingest import epochend, formats, tables
    from trainguard.ingest.plans import Plan, read_plan

    with open(path, "rb") as f:
        sniff_binary(f.read(8192), path)
    contract = formats.contract(FORMAT)
    assert contract is not None
    facts = Facts(mtime=path.stat().st_mtime)
    last = _planned_last(path)
    stated = read_plan(path.parent, contract)
    if last is not None:  # the rows' own `/N` (after a fine-tune's added epochs) over opt.yaml's
        stated = Plan(length=last + 1, length_key="epoch/N", source=f"{path.name} (epoch/N)")
    plan: dict[str, Any] = {"parts_relation": contract.parts, "step_unit": "epoch",
                            "lr_decays_only": contract.lr_decays_only}
    if stated.length:
        plan["total_steps"] = stated.length
    rows = epochend.judge(_rows(path, facts), "epoch", facts, stated, lr_schedule=False)
    return Source(path=path, format=FORMAT, facts=facts, plan=plan, log_like=True,
                  events=tables.merged(rows, "epoch", facts, contract.parts_from))


def _planned_last(path: Path) -> int | None:
    """The `/N` of the last row's first field: the last planned epoch (0-based)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - 4096))
            tail = f.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return None
    for line in reversed(tail):
        fields = line.split()
        if fields and (m := _EPOCH.match(fields[0])) is not None:
            return int(m.group(2))
    return None


def _rows(path: Path, facts: Facts) -> Iterator[dict[str, Any]]:
    from trainguard.ingest.formats.yolov7 import COLUMNS, EVAL_COLUMNS, NOT_METRICS
    from trainguard.ingest.tables import _bounded

    # (the tables' bounded line reader: a row is never held whole)

    with open(path, "rb") as raw:
        for line in _bounded(raw, facts):
            fields = line.split()
            if not fields:
                continue
            facts.lines += 1
            m = _EPOCH.match(fields[0])
            if m is None or len(fields) != len(COLUMNS):
                facts.skipped += 1  # a truncated last row, or a line that is no row
                continue
            row: dict[str, Any] = {"epoch": m.group(1)}
            for name, value in zip(COLUMNS[1:], fields[1:], strict=True):
                if name not in NOT_METRICS and to_number(value) is not None:
                    row[name] = value
            if all(to_number(row.get(c)) == 0 for c in EVAL_COLUMNS):
                for c in EVAL_COLUMNS:  # `--notest`: this epoch was not evaluated; its zeros are no scores
                    row.pop(c, None)
            yield row
