"""One run over many nodes: each node's part in `RUN/node-<N>/`, read back as one run.

    trainguard run --run-dir /shared/run -- torchrun --nnodes=2 --node_rank=1 ...   # writes /shared/run/node-1/
    node_dirs(run_dir)           # [RUN/node-0, RUN/node-1]: the parts that exist
    merged_connection(run_dir)   # one read-only SQLite connection whose tables are the nodes' tables, unioned
    merged_status(run_dir)       # one status: the worst state, every node's findings (each saying its node)

Why a folder per node and not one `run.db`: the nodes of a job share at most a network file system, and
SQLite's locking is not to be trusted there; each node's watchdog and ranks write their own store, as on
one node, and readers join them. The ranks are global (torchrun's RANK), so rows from different nodes
never collide; `meta` keys that every node writes (command, host) are taken from the lowest node.
"""

from __future__ import annotations

import os
import re
import sqlite3
from pathlib import Path
from typing import Any

from trainguard.folderio import check_sqlite
from trainguard.store.schema import DB_NAME, STEP_COLUMNS

NODE_DIR = "node-{}"
_NODE_RE = re.compile(r"^node-(\d+)$")
MAX_ATTACHED = 10  # SQLite's default limit of attached databases: nodes past it are left out, and said so
TABLES = ("steps", "events", "heartbeat", "ranks")
_EVENT_COLUMNS = ("t", "attempt", "rank", "pid", "step", "kind", "name", "data")
_RENUMBERED = {"steps": ("rowid", STEP_COLUMNS), "events": ("id", _EVENT_COLUMNS)}
# a node that ended in one of these is the run's end; "running" wins while any node runs
_BAD_FIRST = ("crashed", "hung", "killed", "failed", "abandoned", "cut-off")


def node_dir(run_dir: str | Path, node: int) -> Path:
    return Path(run_dir) / NODE_DIR.format(node)


def node_dirs(run_dir: str | Path) -> list[Path]:
    """The node parts of a run folder, by node number; [] for a run of one node (its store at the top)."""
    base = Path(run_dir)
    if os.path.lexists(base / DB_NAME) or not base.is_dir():
        return []
    found = []
    for p in base.iterdir():
        m = _NODE_RE.match(p.name)
        # a node part that is a link is not this run's: never followed (folderio.py)
        if m and p.is_dir() and not p.is_symlink() and (os.path.lexists(p / DB_NAME)
                                                        or os.path.lexists(p / "status.json")):
            found.append((int(m.group(1)), p))
    return [p for _, p in sorted(found)]


def node_of(path: Path) -> int:
    m = _NODE_RE.match(path.name)
    return int(m.group(1)) if m else 0


def merged_connection(run_dir: str | Path, timeout: float = 10.0) -> sqlite3.Connection | None:
    """A read-only connection whose `steps`, `events`, `heartbeat`, `ranks` and `meta` are every node's,
    unioned (temporary views over the attached stores); None when the folder has no node parts."""
    dirs = [d for d in node_dirs(run_dir) if os.path.lexists(d / DB_NAME)][:MAX_ATTACHED]
    if not dirs:
        return None
    for d in dirs:
        check_sqlite(d / DB_NAME)
    conn = sqlite3.connect("file::memory:", uri=True, timeout=timeout, check_same_thread=False)
    conn.text_factory = lambda raw: raw.decode("utf-8", "replace")
    names = []
    for i, d in enumerate(dirs):
        conn.execute(f"ATTACH DATABASE ? AS n{i}", (f"file:{d / DB_NAME}?mode=ro",))
        names.append(f"n{i}")
    have = {n: {r[0] for r in conn.execute(f"SELECT name FROM {n}.sqlite_master WHERE type='table'")} for n in names}
    for table in TABLES:
        parts = [f"SELECT * FROM {n}.{table}" for n in names if table in have[n]]
        if not parts:
            continue
        union = " UNION ALL ".join(parts)
        if table in _RENUMBERED:
            # readers page through steps by rowid and events by id: one sequence over the nodes, in time order
            key, cols = _RENUMBERED[table]
            union = (f"SELECT ROW_NUMBER() OVER (ORDER BY t) AS {key}, {', '.join(cols)} FROM ("
                     + " UNION ALL ".join(f"SELECT {', '.join(cols)} FROM {n}.{table}" for n in names
                                          if table in have[n]) + ")")
        conn.execute(f"CREATE TEMP VIEW {table} AS " + union)
    metas = [n for n in names if "meta" in have[n]]
    if metas:
        # a key every node writes (command, host, label) comes from the lowest node that has it
        parts = [f"SELECT key, value FROM {metas[0]}.meta"]
        for i, n in enumerate(metas[1:], 1):
            earlier = " UNION ".join(f"SELECT key FROM {m}.meta" for m in metas[:i])
            parts.append(f"SELECT key, value FROM {n}.meta WHERE key NOT IN ({earlier})")
        conn.execute("CREATE TEMP VIEW meta AS " + " UNION ALL ".join(parts))
    conn.execute(f"PRAGMA busy_timeout={int(timeout * 1000)}")
    return conn


def merged_status(run_dir: str | Path) -> dict[str, Any]:
    """One status for a run over nodes: {} when the folder has no node parts.

    The state: "running" while a node runs; else the state of the node that went wrong first (the earliest
    end among those that did not complete); else the shared state. Findings are every node's, each with
    its `node`; `nodes` lists each node's state, step and folder."""
    from trainguard.store.status import read_status

    dirs = node_dirs(run_dir)
    if not dirs:
        return {}
    parts = []
    for d in dirs:
        try:
            parts.append((node_of(d), d, read_status(d)))
        except Exception as exc:  # a damaged part is one node's problem, not the whole run's
            parts.append((node_of(d), d, {"state": f"unknown ({exc})"}))
    base = dict(next((st for _, _, st in parts if st), {}))
    states = [st.get("state") for _, _, st in parts]
    bad = [(st.get("ended") or float("inf"), st.get("state")) for _, _, st in parts if st.get("state") in _BAD_FIRST]
    if any(s == "running" for s in states):
        base["state"] = "running"
    elif bad:
        base["state"] = min(bad, key=lambda b: b[0])[1]
    elif states:
        base["state"] = states[0]
    findings = []
    for node, _, st in parts:
        for f in st.get("findings") or []:
            findings.append({**f, "node": node})
    base["findings"] = findings
    steps: list[float] = [st["step"] for _, _, st in parts if isinstance(st.get("step"), (int, float))]
    base["step"] = max(steps) if steps else base.get("step")
    base["nodes"] = {str(node): {"state": st.get("state"), "step": st.get("step"), "exit_code": st.get("exit_code"),
                                 "dir": str(d)} for node, d, st in parts}
    codes = [st.get("exit_code") for _, _, st in parts if st.get("exit_code")]
    if codes:
        base["exit_code"] = codes[0]
    from trainguard.store.status import health_of

    base["health"] = health_of(base)
    return base
