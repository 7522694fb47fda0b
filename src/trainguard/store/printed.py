"""What the command printed, kept: the step metrics `trainguard run` read from a script's output.

A script run without `trainguard.watch()` (the automatic probe, or no probe at all) prints its loss
(`iter 100: loss 2.31`) but no probe ever measures it, so the steps table holds no loss. The watchdog
reads those lines live (watchdog/liveoutput.py) and keeps what no probe measured in a table of its own,
`printed`, in run.db: the report, the sinks and `trainguard compare` fall back to it where the probe
recorded no loss.

Why a table of its own and not rows in `steps`: every reader of `steps` (the probe's and the watchdog's
rules, diagnose's replay) would count a printed loss a second time beside the one the rules already
read from the output. Only the consumers that want it read this table, and only when the probe has no
loss: a printed number never stands beside a measured one.

The watchdog writes it through a connection of its own (SQLite in WAL mode takes a second writer; the
busy timeout waits out the probe's commits). Fail-open: a row that cannot be written now waits for the
next flush, bounded; the run never waits on it.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from trainguard.store.schema import DB_NAME, connect
from trainguard.store.writer import _finite_or_text, to_json

PRINTED_COLUMNS = ("loss", "lr", "grad_norm")
MAX_PENDING = 10_000  # rows kept for a later flush while the database cannot be written

_DDL = """
CREATE TABLE IF NOT EXISTS printed (
    attempt   INTEGER NOT NULL DEFAULT 0,
    step      INTEGER NOT NULL,
    t         REAL NOT NULL,
    loss      REAL,
    lr        REAL,
    grad_norm REAL,
    parts     TEXT
);
"""
_INSERT = "INSERT INTO printed (attempt, step, t, loss, lr, grad_norm, parts) VALUES (?, ?, ?, ?, ?, ?, ?)"


class PrintedLog:
    """Queues printed step metrics and commits them on `flush`; never raises."""

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)
        self._conn: sqlite3.Connection | None = None
        self._pending: list[tuple] = []
        self.last_error: str | None = None

    def add(self, row: dict[str, Any], *, attempt: int = 0) -> None:
        """A printed step: `step`, `t`, and any of loss, lr, grad_norm and `parts` (name -> value)."""
        values = [_finite_or_text(row.get(c)) if isinstance(row.get(c), (int, float)) else None
                  for c in PRINTED_COLUMNS]
        parts = {k: _finite_or_text(v) for k, v in (row.get("parts") or {}).items() if isinstance(v, (int, float))}
        if all(v is None for v in values) and not parts:
            return
        self._pending.append((attempt, int(row["step"]), float(row["t"]), *values, to_json(parts or None)))
        del self._pending[:-MAX_PENDING]

    def flush(self) -> None:
        if not self._pending:
            return
        try:
            if self._conn is None:
                self._conn = connect(self.run_dir)
                self._conn.executescript(_DDL)
            with self._conn:
                self._conn.executemany(_INSERT, self._pending)
            self._pending = []
        except (sqlite3.Error, OSError) as exc:
            self.last_error = f"{type(exc).__name__}: {exc}"

    def close(self) -> None:
        self.flush()
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def printed_rows(run_dir: str | Path, *, since_rowid: int = 0) -> list[dict[str, Any]]:
    """The printed steps written after `since_rowid`, in the order they were written, each with its
    `rowid`; non-finite values come back as floats; [] for a run with no such table."""
    if not (Path(run_dir) / DB_NAME).is_file():
        return []
    try:
        conn = connect(run_dir, readonly=True)
    except sqlite3.Error:
        return []
    try:
        rows = conn.execute("SELECT rowid, step, t, loss, lr, grad_norm, parts FROM printed WHERE rowid > ? "
                            "ORDER BY rowid", (since_rowid,)).fetchall()
    except sqlite3.Error:
        return []  # written before this table existed, or never by a watchdog
    finally:
        conn.close()
    from trainguard.store.reader import _num, _numdict, load_json

    out = []
    for rowid, step, t, *values, parts in rows:
        if not isinstance(step, int):
            continue
        rec: dict[str, Any] = {"rowid": rowid, "step": step, "t": _num(t)}
        for name, value in zip(PRINTED_COLUMNS, values):
            value = _num(value)
            if isinstance(value, (int, float)):
                rec[name] = float(value)
        parsed = _numdict(load_json(parts))
        if isinstance(parsed, dict):
            rec["parts"] = {k: float(v) for k, v in parsed.items() if isinstance(v, (int, float))}
        out.append(rec)
    return out


def read_printed(run_dir: str | Path) -> list[dict[str, Any]]:
    """The printed steps in step order, the last write of a step winning (a restart prints it again)."""
    by_step: dict[int, dict[str, Any]] = {}
    for rec in printed_rows(run_dir):
        rec.pop("rowid")
        by_step[rec["step"]] = rec
    return sorted(by_step.values(), key=lambda r: r["step"])
