"""The buffered writer: rows are queued by the caller and committed in batches.

The probe queues rows from the training thread (a deque append, nothing more) and its background thread
calls `flush()` a few times a second, so a SIGKILL loses at most the last fraction of a second. Every
method is cheap to call and never raises into the caller: a store that cannot be written is reported
once to the guard's own log and then ignored (the guard never becomes the failure).
"""

from __future__ import annotations

import collections
import json
import math
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainguard.contract import HEARTBEAT_FIELDS
from trainguard.store.ranks import RankInfo
from trainguard.store.schema import RANK_COLUMNS, STEP_COLUMNS, connect
from trainguard.store.status import release_space

COMMIT_SLICE = 32  # rows bound between two chances to pause (`flush(pause=...)`): ~0.1-0.3 ms of Python
MAX_QUEUED = 200_000  # rows kept per queue while the database cannot be written; older ones are dropped
# the steps table's columns between (attempt, rank) and (parts, weights, extra), in order (`add_step`)
_PLAIN_COLUMNS = STEP_COLUMNS[2:-3]
assert STEP_COLUMNS[:2] == ("attempt", "rank") and STEP_COLUMNS[-3:] == ("parts", "weights", "extra")
_STEP_SQL = f"INSERT INTO steps ({', '.join(STEP_COLUMNS)}) VALUES ({', '.join('?' * len(STEP_COLUMNS))})"
_META_SQL = "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)"
_BEAT_SQL = (f"INSERT OR REPLACE INTO heartbeat ({', '.join(HEARTBEAT_FIELDS)})"
             f" VALUES ({', '.join('?' * len(HEARTBEAT_FIELDS))})")
_RANK_SQL = f"INSERT OR REPLACE INTO ranks ({', '.join(RANK_COLUMNS)}) VALUES ({', '.join('?' * len(RANK_COLUMNS))})"
_EVENT_SQL = "INSERT INTO events (t, attempt, rank, pid, step, kind, name, data) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"


def to_json(value: Any) -> str | None:
    if value is None:
        return None
    return _encode(value)


def _json_default(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, (set, tuple)):
        return list(value)
    if isinstance(value, Path):
        return str(value)
    return repr(value)


# One encoder for every row: json.dumps with options builds a new one per call, a third of the cost of
# encoding a step's parts (three per row, on the probe's background thread). Encoding keeps no state.
_encode = json.JSONEncoder(default=_json_default, allow_nan=True).encode


class StoreWriter:
    """Queues rows for one process of a run and commits them in batches.

    `rank` and `attempt` are stamped on every row; `pid` on every event and on the heartbeat.
    """

    def __init__(self, run_dir: str | Path, *, rank: int = 0, attempt: int = 0) -> None:
        self.run_dir = Path(run_dir)
        self.rank = rank
        self.attempt = attempt
        self.pid = os.getpid()
        self._conn: sqlite3.Connection | None = connect(self.run_dir)
        self._steps: collections.deque[tuple] = collections.deque()
        self._events: collections.deque[tuple] = collections.deque()
        self._meta: dict[str, str] = {}
        self._beat: tuple | None = None
        self._place: tuple | None = None  # this process's row of the `ranks` table, until committed
        self._last_weights: Any = None  # the last step row's weights and their JSON (`add_step`)
        self._last_weights_json: str | None = None
        self._lock = threading.Lock()  # one flush at a time; queueing needs no lock (deque is atomic)
        # Called with each step row and event as it is queued (the probe's in-memory feed to its rules)
        self.tap: Callable[[dict[str, Any]], None] | None = None
        self.last_error: str | None = None
        self.failed_flushes = 0
        self.disk_full = False  # the last failed flush failed because the disk is full
        self.dropped = 0
        self.refused = 0  # rows the database refused outright (a value SQLite cannot bind): dropped, counted
        self.first_refusal: str | None = None  # what the first refused row was and why (for the guard's log)
        self.unstored: str | None = None
        """After close: what could not be stored at all and why ("200 steps (101-300) and 3 events ..."), or
        None when everything queued was written. The owner says it; the writer never prints."""

    # -- queueing: cheap, any thread ------------------------------------------------------------

    def add_step(self, row: dict[str, Any]) -> None:
        get = row.get
        # one value per column (STEP_COLUMNS' order): numbers, text, JSON
        values: list[Any] = [self.attempt, self.rank]
        values.extend([_finite_or_text(get(col)) for col in _PLAIN_COLUMNS])
        values.append(to_json(get("parts") or None))
        weights = get("weights") or None
        if weights != self._last_weights or weights is None:
            # a run's weights rarely change from one step to the next: encoded once while they stay
            self._last_weights, self._last_weights_json = weights, to_json(weights)
        values.append(self._last_weights_json)
        values.append(to_json(get("extra") or None))
        self._steps.append(tuple(values))
        if self.tap is not None:
            self.tap(dict(row))  # a copy: what the rules see is what was stored, whatever the caller does next

    def add_event(self, kind: str, name: str | None = None, data: Any = None, *,
                  step: int | None = None, t: float | None = None) -> None:
        t = t if t is not None else time.time()
        self._events.append((t, self.attempt, self.rank, self.pid, step, kind, name, to_json(data)))
        if self.tap is not None:
            self.tap({"kind": kind, "name": name, "step": step, "t": t, "data": data})

    def set_meta(self, key: str, value: Any) -> None:
        self._meta[key] = to_json(value) or "null"

    def set_rank_info(self, info: RankInfo) -> None:
        """Where this process is in the job (its node and host): one row of `ranks`, for this attempt."""
        row = {**info, "attempt": self.attempt, "rank": self.rank, "t": time.time()}
        self._place = tuple(row.get(col) for col in RANK_COLUMNS)

    def set_heartbeat(self, *, t_progress: float | None, micro: int, step: int, phase: str | None,
                      state: str) -> None:
        # in HEARTBEAT_FIELDS' order
        self._beat = (self.pid, self.rank, self.attempt, t_progress, time.time(), micro, step, phase, state)

    # -- committing ---------------------------------------------------------------------------------

    def flush(self, pause: Callable[[], None] | None = None) -> int:
        """Commit everything queued so far; returns the number of rows written.

        `pause`, when given, is called between slices of COMMIT_SLICE rows (the probe's background thread
        passes its pacing: binding a half second's rows is a millisecond of Python that would otherwise
        hold the interpreter lock from the training thread in one go); the commit stays one transaction.

        Never raises: when the database cannot be written now (locked past the busy timeout, disk full),
        the rows go back to the head of their queues for the next flush (up to MAX_QUEUED, oldest dropped
        and counted beyond that) and the error is kept in `last_error`. A row the database refuses for
        what it holds (a value it cannot bind) would be refused again at every flush and block every row
        behind it, so it is dropped alone and counted in `refused`; the rest of the batch is written.
        """
        with self._lock:
            if self._conn is None:
                return 0
            steps = _drain(self._steps)
            events = _drain(self._events)
            meta, self._meta = self._meta, {}
            beat, self._beat = self._beat, None
            place, self._place = self._place, None
            if not (steps or events or meta or beat or place):
                return 0
            try:
                self._commit(meta, steps, events, beat, place, pause)
            except (sqlite3.InterfaceError, sqlite3.ProgrammingError, sqlite3.IntegrityError, sqlite3.DataError):
                steps, events = self._without_refused(steps, _STEP_SQL), self._without_refused(events, _EVENT_SQL)
                meta = {k: v for k, v in meta.items() if self._accepts(_META_SQL, (k, v))}
                beat = beat if beat is None or self._accepts(_BEAT_SQL, beat) else None
                place = place if place is None or self._accepts(_RANK_SQL, place) else None
                try:
                    self._commit(meta, steps, events, beat, place)
                except sqlite3.Error as exc:
                    return self._keep_for_later(exc, steps, events, meta, beat, place)
            except sqlite3.Error as exc:
                return self._keep_for_later(exc, steps, events, meta, beat, place)
            return len(steps) + len(events)

    def _commit(self, meta: dict[str, str], steps: list[tuple], events: list[tuple], beat: tuple | None,
                place: tuple | None = None, pause: Callable[[], None] | None = None) -> None:
        """One transaction: all of it or nothing."""
        conn = self._conn
        assert conn is not None
        with conn:
            if meta:
                conn.executemany(_META_SQL, list(meta.items()))
            for sql, rows in ((_STEP_SQL, steps), (_EVENT_SQL, events)):
                if pause is None:
                    if rows:
                        conn.executemany(sql, rows)
                    continue
                for i in range(0, len(rows), COMMIT_SLICE):
                    pause()
                    conn.executemany(sql, rows[i:i + COMMIT_SLICE])
            if beat:
                conn.execute(_BEAT_SQL, beat)
            if place:
                conn.execute(_RANK_SQL, place)

    def _keep_for_later(self, exc: sqlite3.Error, steps: list[tuple], events: list[tuple], meta: dict[str, str],
                        beat: tuple | None, place: tuple | None = None) -> int:
        """The database cannot be written now: the rows go back to the head of their queues."""
        self.last_error = f"{type(exc).__name__}: {exc}"
        self.disk_full = getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL or "is full" in str(exc)
        self.failed_flushes += 1
        self._steps.extendleft(reversed(steps))
        self._events.extendleft(reversed(events))
        self._meta = {**meta, **self._meta}
        self._beat = self._beat or beat
        self._place = self._place or place
        for queue in (self._steps, self._events):
            while len(queue) > MAX_QUEUED:
                queue.popleft()
                self.dropped += 1
        return 0

    def _without_refused(self, rows: list[tuple], sql: str) -> list[tuple]:
        return [row for row in rows if self._accepts(sql, row)]

    def _accepts(self, sql: str, row: tuple) -> bool:
        """Tries one row in a savepoint that is rolled back: does the database take what it holds?"""
        conn = self._conn
        assert conn is not None
        try:
            conn.execute("SAVEPOINT probe_row")
            try:
                conn.execute(sql, row)
            finally:
                conn.execute("ROLLBACK TO probe_row")
                conn.execute("RELEASE probe_row")
        except (sqlite3.InterfaceError, sqlite3.ProgrammingError, sqlite3.IntegrityError, sqlite3.DataError) as exc:
            self.refused += 1
            if self.first_refusal is None:
                self.first_refusal = f"{type(exc).__name__}: {exc} (row {_short(row)})"
            return False
        except sqlite3.Error:
            return True  # not the row's fault (locked, disk full): the commit decides, rows are kept
        return True

    def close(self) -> None:
        try:
            self.flush()
            if self.disk_full and (self._steps or self._events or self._meta) and release_space(self.run_dir):
                # The last rows (a finish, a crash) are the run's last words: the run's reserve beside
                # status.json is given up for them rather than lose them to a disk the run filled.
                self.flush()
        finally:
            with self._lock:
                self.unstored = self._count_unstored()
                if self._conn is not None:
                    self._conn.close()
                    self._conn = None

    def _count_unstored(self) -> str | None:
        """What is still queued (the database never took it) or was dropped past MAX_QUEUED, in words."""
        steps = [row[STEP_COLUMNS.index("step")] for row in self._steps]
        lost_steps, lost_events = len(steps) + self.dropped, len(self._events)
        if not (lost_steps or lost_events):
            return None
        numbers = [s for s in steps if isinstance(s, int)]
        span = f" ({min(numbers)}-{max(numbers)})" if numbers else ""
        what = [f"{lost_steps} step row(s){span}" if lost_steps else "", f"{lost_events} event(s)" if lost_events else ""]
        return (f"{' and '.join(w for w in what if w)} could not be stored in {self.run_dir / 'run.db'}: "
                f"{self.last_error or 'the database was not writable'}")


def _drain(queue: collections.deque) -> list:
    out = []
    while True:
        try:
            out.append(queue.popleft())
        except IndexError:
            return out


def _short(row: tuple) -> str:
    text = repr(row)
    return text if len(text) <= 200 else text[:200] + "..."


def _finite_or_text(value: Any) -> Any:
    # SQLite stores NaN as NULL, which would hide the very thing we must show; keep it as text.
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)  # 'nan', 'inf', '-inf'
    return value
