"""Reading a run folder back: meta, steps, events, heartbeats and findings.

Works on a live run (a read-only connection sees what the writers committed) and on a dead one.
Values stored as text because SQLite cannot hold them ('nan', 'inf') come back as floats.
"""

from __future__ import annotations

import math
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trainguard import untrusted
from trainguard.contract import FLIGHT_ANSWER_PREFIX, HEARTBEAT_FIELDS
from trainguard.errors import UserError
from trainguard.findings import Finding
from trainguard.store.ranks import RankInfo
from trainguard.store.schema import DB_NAME, RANK_COLUMNS, STEP_COLUMNS, connect
from trainguard.store.status import read_status

# the shape each meta key is written in (store writers: watchdog, probe); per-rank keys (`probe.0`) are objects
META_SHAPES: dict[str, type | tuple[type, ...]] = {
    "plan": dict, "command": list, "config": dict, "cwd": str, "env": dict, "host": str, "label": str,
    "started": (int, float), "user": str, "watchdog": dict,
}


def _num(value: Any) -> Any:
    """A stored number back: 'nan'/'inf' text as floats; anything else that is not a number (text, a blob,
    an integer past any float: a damaged store) as None, so no rule does arithmetic on it."""
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    if isinstance(value, int) and not isinstance(value, bool):
        return value if -2**62 < value < 2**62 else None
    return value if isinstance(value, float) else None


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and -2**62 < value < 2**62 else None


def _text_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def load_json(text: str | None) -> Any:
    """A JSON column back to Python; None for NULL or text that is not JSON."""
    if text is None:
        return None
    try:
        return untrusted.load_json(text)
    except ValueError:  # also nesting too deep and numbers too long, from a damaged store
        return None


def _numdict(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _num(v) for k, v in value.items()}
    return value


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


class RunReader:
    """Read-only view of one run folder."""

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)
        self._conn: sqlite3.Connection | None = None
        if os.path.lexists(self.run_dir / DB_NAME):  # a link or a FIFO in its place is refused by connect
            try:
                self._conn = connect(self.run_dir, readonly=True)
                tables = {r[0] for r in self._conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            except (sqlite3.Error, UnicodeDecodeError) as exc:  # a damaged file: names that are not even text
                raise UserError(f"cannot read {self.run_dir / DB_NAME}: {exc} (not a trainguard run store?)") from None
            if "steps" not in tables or "events" not in tables:
                # a store whose writer never got as far as the schema: read as empty
                self._conn.close()
                self._conn = None
        else:
            from trainguard.store.nodes import merged_connection

            try:  # a run over nodes: their stores read as one (store/nodes.py)
                self._conn = merged_connection(self.run_dir)
            except sqlite3.Error as exc:
                raise UserError(f"cannot read the node stores under {self.run_dir}: {exc}") from None

    @property
    def has_db(self) -> bool:
        return self._conn is not None

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> RunReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _query(self, sql: str, args: tuple = ()) -> list[tuple]:
        if self._conn is None:
            return []
        try:
            return self._conn.execute(sql, args).fetchall()
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                return []  # a folder whose writer never got as far as the schema
            raise UserError(f"cannot read {self.run_dir / DB_NAME}: {exc}") from None
        except (sqlite3.DatabaseError, UnicodeDecodeError) as exc:
            raise UserError(f"cannot read {self.run_dir / DB_NAME}: {exc}") from None

    # -- the pieces ---------------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        return read_status(self.run_dir)

    def meta(self) -> dict[str, Any]:
        """Each key's value as the writer stored it; a value of the wrong shape for its key (a damaged
        store) is left out, so readers can rely on `plan` being an object and `command` a list."""
        out = {}
        for k, v in self._query("SELECT key, value FROM meta"):
            if not isinstance(k, str):
                continue
            value = load_json(v) if isinstance(v, str) else None
            shape = META_SHAPES.get(k) or (dict if "." in k else None)
            if shape is not None and not isinstance(value, shape):
                continue
            if k == "command" and isinstance(value, list):
                value = [str(c) for c in value]
            out[k] = value
        return out

    def steps(self, *, rank: int | None = None, since_rowid: int = 0, by_time: bool = False) -> Iterator[dict[str, Any]]:
        """One dict per optimizer step, in the order they were written (`by_time`: in the order of their `t`)."""
        where = "WHERE rowid > ?"
        args: tuple = (since_rowid,)
        if rank is not None:
            where += " AND rank = ?"
            args += (rank,)
        if self._conn is None:
            return
        try:
            yield from self._step_rows(where, args, "t, rowid" if by_time else "rowid")
        except (sqlite3.DatabaseError, UnicodeDecodeError) as exc:  # damage found while streaming the rows
            raise UserError(f"cannot read {self.run_dir / DB_NAME}: {exc}") from None

    def _step_rows(self, where: str, args: tuple, order: str = "rowid") -> Iterator[dict[str, Any]]:
        assert self._conn is not None
        cur = self._conn.execute(f"SELECT rowid, {', '.join(STEP_COLUMNS)} FROM steps {where} ORDER BY {order}", args)
        for row in cur:
            rec: dict[str, Any] = {"kind": "step", "rowid": row[0]}
            for col, value in zip(STEP_COLUMNS, row[1:]):
                if col in ("parts", "weights", "extra"):
                    rec[col] = _dict(_numdict(load_json(value)))
                else:
                    rec[col] = _num(value)
            if not isinstance(rec["step"], int):
                continue  # a row without a step number is no step (a damaged store)
            rec["attempt"], rec["rank"] = _int_or_none(rec["attempt"]) or 0, _int_or_none(rec["rank"]) or 0
            yield rec

    def last_step(self) -> dict[str, Any] | None:
        rows = self._query(f"SELECT rowid, {', '.join(STEP_COLUMNS)} FROM steps ORDER BY rowid DESC LIMIT 1")
        if not rows:
            return None
        rec = {"kind": "step", "rowid": rows[0][0]}
        for col, value in zip(STEP_COLUMNS, rows[0][1:]):
            rec[col] = _dict(_numdict(load_json(value))) if col in ("parts", "weights", "extra") else _num(value)
        if not isinstance(rec["step"], int):
            return None
        rec["attempt"], rec["rank"] = _int_or_none(rec["attempt"]) or 0, _int_or_none(rec["rank"]) or 0
        return rec

    def last_step_of(self, rank: int) -> int | None:
        """A rank's highest stored step: the step index walked from the end, stopping at its first row."""
        rows = self._query("SELECT step FROM steps WHERE rank = ? ORDER BY step DESC LIMIT 1", (rank,))
        return rows[0][0] if rows and isinstance(rows[0][0], int) else None

    def step_count(self) -> int:
        rows = self._query("SELECT COUNT(*) FROM steps")
        return rows[0][0] if rows else 0

    def events(self, kind: str | None = None, *, since_id: int = 0) -> list[dict[str, Any]]:
        sql = "SELECT id, t, attempt, rank, pid, step, kind, name, data FROM events WHERE id > ?"
        args: tuple = (since_id,)
        if kind is not None:
            sql += " AND kind = ?"
            args += (kind,)
        out = []
        for id_, t, attempt, rank, pid, step, kind_, name, data in self._query(sql + " ORDER BY id", args):
            # each column of the type the writer gives it (a damaged store's are not): None otherwise
            out.append({"id": id_, "t": _num(t), "attempt": _int_or_none(attempt) or 0,
                        "rank": _int_or_none(rank) or 0, "pid": _int_or_none(pid), "step": _int_or_none(step),
                        "kind": _text_or_none(kind_), "name": _text_or_none(name), "data": load_json(data)})
        return out

    def heartbeats(self) -> list[dict[str, Any]]:
        cols = HEARTBEAT_FIELDS
        out = []
        for row in self._query(f"SELECT {', '.join(cols)} FROM heartbeat"):
            beat = dict(zip(cols, row))
            for key, value in beat.items():  # numbers where the writer writes numbers (a damaged store: None)
                if key not in ("phase", "state"):
                    beat[key] = _num(value)
            beat["phase"], beat["state"] = _text_or_none(beat.get("phase")), _text_or_none(beat.get("state"))
            for key in ("pid", "rank", "attempt", "step", "micro"):
                if key in beat:
                    beat[key] = _int_or_none(beat[key])
            out.append(beat)
        return out

    def steps_reached(self) -> dict[int, int]:
        """Rank -> the last step it is known to have finished, from what it wrote besides its rows: its
        heartbeat and its answers to the watchdog's flight-recorder requests. Why: a rank's rows can end
        long before the rank did. Over NCCL a collective that cannot complete wedges the GPU, and a rank's
        background thread then blocks in its next device call with the rows of the last steps unwritten;
        the answering thread never touches the device (probe/steps.py, `start_flight_answers`), so its
        answer still says how far the rank got. A new user's hung DDP job was told "rank 1 stopped at step
        459" when rank 1 had run to step 500."""
        out: dict[int, int] = {}

        def heard(rank: Any, step: Any) -> None:
            if isinstance(rank, int) and rank >= 0 and isinstance(step, int) and step >= 0:
                out[rank] = max(out.get(rank, step), step)

        beats = self.heartbeats()
        answers = {key[len(FLIGHT_ANSWER_PREFIX):]: value for key, value in self.meta().items()
                   if key.startswith(FLIGHT_ANSWER_PREFIX) and isinstance(value, dict)}
        # a restarted run resumes from a checkpoint: an earlier attempt's steps say nothing of this one's
        attempts = [x.get("attempt") for x in [*beats, *answers.values()]]
        attempt = max((a for a in attempts if isinstance(a, int)), default=None)
        beats = [b for b in beats if b.get("attempt") == attempt]
        since = min((b["t_progress"] for b in beats if isinstance(b.get("t_progress"), (int, float))), default=0.0)
        for beat in beats:
            heard(beat.get("rank"), beat.get("step"))
        for rank, value in answers.items():
            step = value.get("step")  # the step it works on when it answered: the one before is finished
            if isinstance(value.get("attempt"), int):
                this_attempt = value["attempt"] == attempt
            else:  # an answer of a probe that did not say its attempt: one given since this attempt's progress
                this_attempt = isinstance(value.get("t"), (int, float)) and value["t"] >= since
            if rank.isdigit() and isinstance(step, int) and this_attempt:
                heard(int(rank), step - 1)
        return out

    def ranks(self, attempt: int | None = None) -> dict[int, RankInfo]:
        """Rank -> its node, host and local rank (the last attempt's row of each rank unless `attempt` is given).

        Empty for a run whose probe never wrote the table (a single process before it existed, a log)."""
        sql = f"SELECT {', '.join(RANK_COLUMNS)} FROM ranks"
        args: tuple = ()
        if attempt is not None:
            sql += " WHERE attempt = ?"
            args = (attempt,)
        out: dict[int, RankInfo] = {}
        for row in self._query(sql + " ORDER BY attempt, t", args):
            rec = dict(zip(RANK_COLUMNS, row))
            for key in ("rank", "local_rank", "node", "world_size", "local_world_size", "pid"):
                rec[key] = _int_or_none(rec[key])
            if rec["rank"] is None or rec["rank"] < 0:
                continue  # a damaged row names no rank
            rec.update({k: rec[k] or 0 for k in ("local_rank", "node")})
            rec.update({k: max(1, rec[k] or 1) for k in ("world_size", "local_world_size")})
            rec["host"] = _text_or_none(rec["host"])
            out[rec["rank"]] = RankInfo(rank=rec["rank"], local_rank=rec["local_rank"], node=rec["node"],
                                        host=rec["host"] or "", world_size=rec["world_size"],
                                        local_world_size=rec["local_world_size"], pid=rec["pid"])
        return out

    def run_findings(self) -> list[Finding]:
        """What the run recorded about itself: status.json's findings (the watchdog's final word, the ending's
        among them) plus any recorded only in the store (`recorded_findings`)."""
        return recorded_findings(self.status(), self.findings())

    def findings(self) -> list[Finding]:
        """Every finding recorded, the latest record of each (code, name, step) kept."""
        seen: dict[tuple, Finding] = {}
        for ev in self.events("finding"):
            data = ev["data"] or {}
            try:
                finding = Finding.from_dict(data)
            except (TypeError, ValueError):
                continue
            seen[(finding.code, finding.name, finding.step, finding.cause)] = finding
        return list(seen.values())

    def iter_events(self) -> Iterator[dict[str, Any]]:
        """Steps and events merged in time order: the stream the rules consume offline.

        Each rank commits its rows in batches, so in a run of several ranks the order of writing is rank 0's
        hundred steps, then rank 1's: read by time instead, the ranks' steps interleave as they happened
        (the rules that compare ranks, and a rank's finding held for rank 0's, rely on it)."""
        steps = self.steps(by_time=len(self.ranks()) > 1)
        events = iter(self.events())
        nxt_step = next(steps, None)
        nxt_ev = next(events, None)
        while nxt_step is not None or nxt_ev is not None:
            if nxt_step is not None and (nxt_ev is None or (nxt_step["t"] or 0) <= (nxt_ev["t"] or 0)):
                yield nxt_step
                nxt_step = next(steps, None)
            elif nxt_ev is not None:
                yield nxt_ev
                nxt_ev = next(events, None)


def finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def recorded_findings(status: dict[str, Any], recorded: list[Finding]) -> list[Finding]:
    """status.json's findings (the watchdog's final word) plus any recorded only in the store."""
    out: list[Finding] = []
    seen: set[tuple] = set()
    for raw in list(status.get("findings") or []):
        try:
            f = Finding.from_dict(raw)
        except (TypeError, ValueError):
            continue
        key = (f.code, f.name, f.step, f.cause)
        if key not in seen:
            seen.add(key)
            out.append(f)
    for f in recorded:
        key = (f.code, f.name, f.step, f.cause)
        if key not in seen:
            seen.add(key)
            out.append(f)
    return out
