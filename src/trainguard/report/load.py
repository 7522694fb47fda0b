"""Loading a run folder for the report: columns of numbers, events, findings, meta, in one pass.

Why not `RunReader.steps()`: it builds one dict per row, which for a million-step run costs more than the
whole report may take. Here the steps table is read once, column-wise, into numpy arrays; the JSON
columns (parts, weights, extra) are parsed in one `json.loads` call over the whole column.

Missing and non-finite are different things and stay different: a NULL (the probe did not record the
value) is "absent", while 'nan'/'inf' stored as text is a real non-finite value the report must mark.
"""

from __future__ import annotations

import gc
import itertools
import json
import math
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from trainguard.errors import UserError
from trainguard.findings import Finding
from trainguard.folderio import exists, read_capped
from trainguard.store.printed import PRINTED_COLUMNS, read_printed
from trainguard.store.reader import RunReader, load_json, recorded_findings
from trainguard.store.schema import DB_NAME, connect
from trainguard.untrusted import load_json as load_untrusted_json

MAX_SCHEDULE_BYTES = 64 << 20  # a simulated LR curve; more is not one

SCALAR_COLUMNS = ("step", "loss", "lr", "grad_norm", "update_ratio", "step_time", "data_wait", "loss_scale")
JSON_COLUMNS = ("parts", "weights", "extra")


@dataclass
class Column:
    """One per-step quantity: values (NaN where absent) and which rows actually recorded it."""

    values: np.ndarray
    present: np.ndarray

    @property
    def any(self) -> bool:
        return bool(self.present.any())

    def finite(self) -> np.ndarray:
        return self.values[self.present & np.isfinite(self.values)]


@dataclass
class RunData:
    run_dir: Path
    status: dict[str, Any]
    meta: dict[str, Any]
    events: list[dict[str, Any]]
    findings: list[Finding]
    columns: dict[str, Column] = field(default_factory=dict)
    parts: dict[str, Column] = field(default_factory=dict)
    weights: dict[str, Column] = field(default_factory=dict)
    extra: dict[str, Column] = field(default_factory=dict)
    ranks: list[int] = field(default_factory=list)
    t_range: tuple[float, float] | None = None  # first and last step time, from SQL (no column needed)
    restarts: list[tuple[int, int]] = field(default_factory=list)  # (attempt, first step it recorded)
    schedule: dict[str, list[float]] | None = None
    printed: tuple[str, ...] = ()  # the columns read from the command's printed output (store/printed.py)

    @property
    def title(self) -> str:
        """How a person names this run: the script's label and its folder (with the parent when the folder
        is a generic 'run')."""
        path = self.run_dir.resolve()
        folder = path.name if path.name not in ("run", "runs", "") else f"{path.parent.name}/{path.name}"
        label = str(self.meta.get("label") or "")
        return f"{label} ({folder})" if label and label not in folder else folder

    @property
    def n_steps(self) -> int:
        col = self.columns.get("step")
        return 0 if col is None else len(col.values)

    def col(self, name: str) -> Column | None:
        c = self.columns.get(name)
        return c if c is not None and c.any else None

    def events_of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["kind"] == kind]


def load_run(run_dir: str | Path, rank: int = 0) -> RunData:
    """Everything the report needs from a run folder. Plots use one rank (0 by default)."""
    run_dir = Path(run_dir)
    with RunReader(run_dir) as reader:
        try:
            status = reader.status()
        except UserError:
            # a post-mortem must still be written when the summary is what broke
            status = {"state": "unknown (status.json is unreadable)"}
        meta = reader.meta()
        events = reader.events()
        recorded = reader.findings()
    data = RunData(run_dir=run_dir, status=status, meta=meta, events=events,
                   findings=recorded_findings(status, recorded))
    if (run_dir / DB_NAME).is_file():
        # A million steps make millions of tuples and dicts that live until the columns are built; the
        # cyclic GC would walk them again and again for nothing (it doubled the load time).
        gc_was_on = gc.isenabled()
        gc.disable()
        try:
            _load_steps(data, run_dir, rank)
        except sqlite3.DatabaseError as exc:  # a damaged store: one line, as for any bad input
            raise UserError(f"cannot read {run_dir / DB_NAME}: {exc}") from None
        finally:
            if gc_was_on:
                gc.enable()
        _add_printed(data, read_printed(run_dir))
    data.schedule = _load_schedule(run_dir)
    return data


def _load_steps(data: RunData, run_dir: Path, rank: int) -> None:
    try:
        conn = connect(run_dir, readonly=True)
    except sqlite3.Error:
        return
    try:
        try:
            ranks = [r[0] for r in conn.execute("SELECT DISTINCT rank FROM steps WHERE typeof(rank) = 'integer'")]
        except sqlite3.OperationalError:
            return  # no steps table: the writer never got that far
        data.ranks = sorted(ranks)
        if ranks and rank not in ranks:
            rank = min(ranks)
        data.restarts = [(int(a), int(s)) for a, s in conn.execute(
            "SELECT attempt, MIN(step) FROM steps WHERE rank = ? AND typeof(attempt) = 'integer' AND attempt > 0 "
            "AND typeof(step) = 'integer' GROUP BY attempt ORDER BY attempt",
            (rank,))]
        t_min, t_max = conn.execute(
            "SELECT MIN(t), MAX(t) FROM steps WHERE typeof(t) IN ('integer', 'real')").fetchone()
        if t_min is not None:
            data.t_range = (float(t_min), float(t_max))
        cols = SCALAR_COLUMNS + JSON_COLUMNS
        # (a damaged store's rows without a whole step number are no steps: left out, as the reader does)
        cur = conn.execute(f"SELECT {', '.join(cols)} FROM steps WHERE rank = ? AND typeof(step) = 'integer' "
                           f"AND abs(step) < 4611686018427387904 ORDER BY rowid", (rank,))
        # In chunks, each turned into arrays before the next is read: a million rows at once as tuples and
        # dicts would hold about a gigabyte, chunked it stays near a tenth of that.
        chunks = []
        while rows := cur.fetchmany(CHUNK_ROWS):
            by_col = list(zip(*rows))
            del rows
            scalars = {name: _column(raw) for name, raw in zip(SCALAR_COLUMNS, by_col)}
            jsons = {name: _json_columns(raw) for name, raw in zip(JSON_COLUMNS, by_col[len(SCALAR_COLUMNS):])}
            chunks.append((len(by_col[0]), scalars, jsons))
            del by_col
    finally:
        conn.close()
    if not chunks:
        return
    data.columns = _concat([(n, c) for n, c, _ in chunks])
    for name in JSON_COLUMNS:
        setattr(data, name, _concat([(n, j[name]) for n, _, j in chunks]))
    _keep_latest_attempt(data)


CHUNK_ROWS = 100_000


def _add_printed(data: RunData, printed: list[dict[str, Any]]) -> None:
    """Where the probe recorded no loss, the metrics the command printed (kept by `trainguard run`) fill
    in: a row per printed step (beside the probe's rows, at the same step where both exist), and only
    the columns the probe left empty, so a printed number never stands beside a measured one."""
    if data.col("loss") is not None or not any("loss" in p or p.get("parts") for p in printed):
        return
    old = data.columns.get("step")
    old_steps = old.values.astype(int).tolist() if old is not None else []
    steps = sorted(set(old_steps) | {p["step"] for p in printed})
    index = {s: i for i, s in enumerate(steps)}
    n, where = len(steps), np.array([index[s] for s in old_steps], dtype=int)

    def spread(col: Column) -> Column:  # a probe column onto the merged rows
        values, present = np.full(n, math.nan), np.zeros(n, dtype=bool)
        values[where], present[where] = col.values, col.present
        return Column(values, present)

    for group in (data.columns, data.parts, data.weights, data.extra):
        for name, col in list(group.items()):
            group[name] = spread(col)
    data.columns["step"] = Column(np.array(steps, dtype=float), np.ones(n, dtype=bool))
    filled = []
    for name in PRINTED_COLUMNS:
        if data.col(name) is None and any(name in p for p in printed):
            data.columns[name] = _from_printed(n, index, [(p["step"], p.get(name)) for p in printed])
            filled.append(name)
    for part in dict.fromkeys(k for p in printed for k in p.get("parts") or {}):
        if part not in data.parts:
            data.parts[part] = _from_printed(n, index, [(p["step"], (p.get("parts") or {}).get(part)) for p in printed])
            filled.append(f"part {part}")
    data.printed = tuple(filled)
    if data.t_range is None:
        times = [p["t"] for p in printed if isinstance(p.get("t"), float)]
        if times:
            data.t_range = (min(times), max(times))


def _from_printed(n: int, index: dict[int, int], pairs: list[tuple[int, Any]]) -> Column:
    values, present = np.full(n, math.nan), np.zeros(n, dtype=bool)
    for step, value in pairs:
        if value is not None:
            values[index[step]], present[index[step]] = value, True
    return Column(values, present)


def _concat(chunks: list[tuple[int, dict[str, Column]]]) -> dict[str, Column]:
    """Joins per-chunk columns; a name missing from a chunk (a part that appears late) is absent there."""
    names = list(dict.fromkeys(name for _, cols in chunks for name in cols))
    out = {}
    for name in names:
        values, present = [], []
        for n, cols in chunks:
            col = cols.get(name)
            values.append(col.values if col is not None else np.full(n, math.nan))
            present.append(col.present if col is not None else np.zeros(n, dtype=bool))
        out[name] = Column(np.concatenate(values), np.concatenate(present))
    return out


def _keep_latest_attempt(data: RunData) -> None:
    """After a restart the steps since the checkpoint are recorded twice; the curves show the last write
    of each step (the restarted attempt), and the restart itself is marked on the plots."""
    steps = data.columns["step"].values
    if len(steps) < 2 or not np.any(np.diff(steps) <= 0):
        return
    _, first_in_reversed = np.unique(steps[::-1], return_index=True)
    keep = np.sort(len(steps) - 1 - first_in_reversed)
    for group in (data.columns, data.parts, data.weights, data.extra):
        for name, col in group.items():
            group[name] = Column(col.values[keep], col.present[keep])


def _column(raw: tuple | list) -> Column:
    try:
        # numpy turns None into NaN and parses 'nan'/'inf' text, all in C
        values = np.array(raw, dtype=float)
    except (TypeError, ValueError):
        values = np.fromiter((_float(v) for v in raw), dtype=float, count=len(raw))
    # only where the value is NaN can it be absent rather than a real NaN; count(None) runs in C and
    # settles the common cases (no NULLs, or every NaN a NULL) without a Python loop
    is_nan = np.isnan(values)
    nones = raw.count(None)
    if nones == 0:
        present = np.ones(len(raw), dtype=bool)
    elif nones == int(is_nan.sum()):
        present = ~is_nan
    else:
        present = np.ones(len(raw), dtype=bool)
        for i in np.flatnonzero(is_nan).tolist():
            present[i] = raw[i] is not None
    return Column(values, present)


def _float(v: Any) -> float:
    if v is None:
        return math.nan
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def _json_columns(raw: tuple) -> dict[str, Column]:
    """{"kd": Column, ...} from a column of JSON objects; numeric values only (no flags, lists, text)."""
    distinct = set(raw)
    if distinct == {None}:
        return {}
    if len(distinct) <= 64:  # weights are usually one fixed dict, repeated: parse each text once
        cache = {v: load_json(v) for v in distinct}
        parsed = list(map(cache.__getitem__, raw))
    else:
        try:
            parsed = json.loads("[" + ",".join(v if v is not None else "null" for v in raw) + "]")
        except (ValueError, RecursionError):  # a damaged row: parse them one by one
            parsed = [load_json(v) for v in raw]
    # map() over C methods instead of comprehensions: this runs over every step of a million-step run
    dicts = parsed if set(map(type, parsed)) == {dict} else [d if isinstance(d, dict) else {} for d in parsed]
    names = list(dict.fromkeys(itertools.chain.from_iterable(dicts)))  # first-seen order, in C
    out = {}
    for name in names:
        values = list(map(dict.get, dicts, itertools.repeat(name)))
        if not set(map(type, values)) <= {float, int, type(None)}:  # the usual case is checked in C
            values = [v if _numeric(v) else None for v in values]
        col = _column(values)
        if col.any:
            out[name] = col
    return out


def _numeric(v: Any) -> bool:
    if isinstance(v, bool):
        return False
    if isinstance(v, (int, float)):
        return True
    return isinstance(v, str) and v in ("nan", "inf", "-inf")




def _load_schedule(run_dir: Path) -> dict[str, list[float]] | None:
    """Preflight's simulated LR curve (schedule.json), in whichever plain shape it was written.

    Accepted: {"curve": [[step, lr], ...]} (what preflight writes), {"steps": [...], "lr": [...]},
    {"points": [{"step", "lr"}, ...]}, or [[step, lr], ...].
    """
    path = run_dir / "schedule.json"
    try:
        raw = load_untrusted_json(read_capped(path, MAX_SCHEDULE_BYTES, "schedule.json")) if exists(path) else None
    except ValueError:  # damaged: no curve drawn (a link or a FIFO in its place is a UserError: one line)
        return None
    steps: list[float] = []
    lrs: list[float] = []
    try:
        if isinstance(raw, dict):
            for key in ("curve", "points"):  # preflight writes {"curve": [[step, lr], ...], ...landmarks}
                if isinstance(raw.get(key), list):
                    raw = raw[key]
                    break
        if isinstance(raw, dict):
            xs = raw.get("steps") or raw.get("step")
            ys = raw.get("lr") or raw.get("lrs")
            if isinstance(xs, list) and isinstance(ys, list):
                steps, lrs = [float(x) for x in xs], [_first(y) for y in ys]
        elif isinstance(raw, list):
            for p in raw:
                if isinstance(p, dict):
                    steps.append(float(p["step"]))
                    lrs.append(_first(p["lr"]))
                else:
                    steps.append(float(p[0]))
                    lrs.append(_first(p[1]))
    except (KeyError, TypeError, ValueError, IndexError):
        return None
    if not steps or len(steps) != len(lrs):
        return None
    return {"steps": steps, "lr": lrs}


def _first(v: Any) -> float:
    """An LR entry may be one number or one per param group; the curve shows group 0."""
    if isinstance(v, list):
        v = v[0] if v else None
    return _float(v)
