"""The store's writer keeps what it could not write: a locked or unwritable database loses no rows."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from trainguard.store.reader import RunReader
from trainguard.store.writer import StoreWriter


def test_rows_survive_a_database_that_is_locked_for_a_while(tmp_path: Path) -> None:
    writer = StoreWriter(tmp_path)
    writer._conn.execute("PRAGMA busy_timeout=100")  # fail fast instead of waiting 10 s
    blocker = sqlite3.connect(tmp_path / "run.db", timeout=1)
    blocker.execute("BEGIN IMMEDIATE")  # another process holds the write lock
    for step in range(1, 6):
        writer.add_step({"step": step, "t": float(step), "loss": 1.0 / step})
    writer.add_event("eval", None, {"loss": 0.5}, step=5)
    assert writer.flush() == 0  # could not write: nothing raised, nothing dropped
    assert writer.last_error and "locked" in writer.last_error
    blocker.rollback()
    blocker.close()
    assert writer.flush() == 6
    writer.close()
    with RunReader(tmp_path) as reader:
        assert [r["step"] for r in reader.steps()] == [1, 2, 3, 4, 5]
        assert len(reader.events("eval")) == 1
