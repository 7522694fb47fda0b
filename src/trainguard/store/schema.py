"""The run store's schema. One file, `run.db`, SQLite in WAL mode.

Why these tables:
- `steps` is wide (one row per optimizer step and rank) so a million-step run reads back in seconds;
  loss parts, weights and rarely used numbers ride in JSON columns.
- `events` holds everything that is not a step: phases, evaluations, checkpoints, crashes, findings,
  samples of memory, lines counted. `kind` says which; `data` is JSON.
- `heartbeat` is one row per writing process, upserted at the flush after it changed (and every few
  seconds regardless, refreshing `t_flush`): the watchdog reads progress from it (the time of the last
  *training* progress, not of the flush, so a stuck loop with a live background thread still looks stuck).
- `meta` is key → JSON value: command, host, versions, the plan.
- `ranks` is one row per rank and attempt: the node and host it runs on (store/ranks.py). Steps, events
  and heartbeats carry the rank alone; this table says where that rank was.

Several processes of one run (ranks, the watchdog) each hold their own connection; SQLite's locking
plus a busy timeout keeps them from corrupting each other.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from trainguard.folderio import check_sqlite

DB_NAME = "run.db"
SCHEMA_VERSION = 1

_DDL = """
CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS steps (
    attempt      INTEGER NOT NULL DEFAULT 0,
    rank         INTEGER NOT NULL DEFAULT 0,
    step         INTEGER NOT NULL,
    t            REAL NOT NULL,
    micro        INTEGER,
    loss         REAL,
    lr           REAL,
    grad_norm    REAL,
    update_ratio REAL,
    nonfinite    INTEGER,
    step_time    REAL,
    data_wait    REAL,
    loss_scale   REAL,
    sched_epoch  INTEGER,
    parts        TEXT,
    weights      TEXT,
    extra        TEXT
);
CREATE INDEX IF NOT EXISTS steps_by_step ON steps (step);
CREATE TABLE IF NOT EXISTS events (
    id      INTEGER PRIMARY KEY AUTOINCREMENT,
    t       REAL NOT NULL,
    attempt INTEGER NOT NULL DEFAULT 0,
    rank    INTEGER NOT NULL DEFAULT 0,
    pid     INTEGER,
    step    INTEGER,
    kind    TEXT NOT NULL,
    name    TEXT,
    data    TEXT
);
CREATE INDEX IF NOT EXISTS events_by_kind ON events (kind);
CREATE TABLE IF NOT EXISTS heartbeat (
    pid        INTEGER PRIMARY KEY,
    rank       INTEGER NOT NULL DEFAULT 0,
    attempt    INTEGER NOT NULL DEFAULT 0,
    t_progress REAL,
    t_flush    REAL NOT NULL,
    micro      INTEGER,
    step       INTEGER,
    phase      TEXT,
    state      TEXT
);
CREATE TABLE IF NOT EXISTS ranks (
    attempt          INTEGER NOT NULL DEFAULT 0,
    rank             INTEGER NOT NULL,
    local_rank       INTEGER NOT NULL DEFAULT 0,
    node             INTEGER NOT NULL DEFAULT 0,
    host             TEXT,
    world_size       INTEGER NOT NULL DEFAULT 1,
    local_world_size INTEGER NOT NULL DEFAULT 1,
    pid              INTEGER,
    t                REAL NOT NULL,
    PRIMARY KEY (attempt, rank)
);
"""

RANK_COLUMNS = ("attempt", "rank", "local_rank", "node", "host", "world_size", "local_world_size", "pid", "t")

STEP_COLUMNS = (
    "attempt", "rank", "step", "t", "micro", "loss", "lr", "grad_norm", "update_ratio", "nonfinite",
    "step_time", "data_wait", "loss_scale", "sched_epoch", "parts", "weights", "extra",
)


def connect(run_dir: str | Path, *, readonly: bool = False, timeout: float = 10.0) -> sqlite3.Connection:
    """Open the run's database, creating the schema when writable."""
    path = Path(run_dir) / DB_NAME
    check_sqlite(path)  # SQLite follows links by name: a planted run.db, -wal or -shm is refused here
    if readonly:
        # mode=ro still reads the WAL, so a reader sees what a live writer committed.
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=timeout, check_same_thread=False)
        conn.text_factory = _lenient_text  # a damaged store may hold bytes that are not UTF-8
    else:
        conn = sqlite3.connect(str(path), timeout=timeout, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        # NORMAL in WAL mode: a committed transaction survives the process being killed (it is in the
        # OS page cache); only a power loss can take the last ones. Cheap enough for the probe.
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.executescript(_DDL)
        conn.execute(
            "INSERT OR IGNORE INTO meta (key, value) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),)
        )
        conn.commit()
    conn.execute(f"PRAGMA busy_timeout={int(timeout * 1000)}")
    return conn


def _lenient_text(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")
