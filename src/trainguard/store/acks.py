"""Acknowledged findings: `trainguard ack RUN CODE --why TEXT` says "I know, this one is harmless here".

    trainguard ack runs/train-0412 TG522 --why "shared machine, the other job is ours"

An acknowledgement is one JSON line in RUN/acks.jsonl (code, name, who, when, why), appended by
`trainguard ack` while the run goes on or after it ended. Everything that reads a run's findings honours
it: the watchdog neither stops the run on that code (`--stop-on`) nor counts it toward the exit code, the
notifiers send nothing more for it, and status.json, `trainguard status`, the report and the sinks show it
as acknowledged (`"acked": {"by", "t", "why"}` on the finding), outside the run's health.

The file sits in the run folder, which is untrusted: it is read capped, regular files only, no link
followed, and a line that is not a well-formed acknowledgement is skipped.
"""

from __future__ import annotations

import getpass
import json
import os
import platform
import re
import time
from pathlib import Path
from typing import Any

ACKS_NAME = "acks.jsonl"
MAX_ACKS_BYTES = 1 << 20  # far more than people type; a larger file is read only this far
MAX_WHY = 500  # characters of --why kept


def add_ack(run_dir: str | Path, code: str, name: str, why: str | None) -> dict[str, Any]:
    """Appends one acknowledgement (O_APPEND: two people acking at once each get their whole line)."""
    record = {"code": code, "name": name, "by": _who(), "t": time.time(), "why": (why or "")[:MAX_WHY]}
    line = (json.dumps(record) + "\n").encode()
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(Path(run_dir) / ACKS_NAME, flags, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)
    return record


def read_acks(run_dir: str | Path) -> dict[str, dict[str, Any]]:
    """{code: its first acknowledgement} ({} when none, or when the file cannot be read). A node's part of a
    run over nodes (RUN/node-<N>/) also honours what was acknowledged for the whole run (RUN/acks.jsonl)."""
    own = _read(Path(run_dir) / ACKS_NAME)
    if re.fullmatch(r"node-\d+", Path(run_dir).name):
        return {**_read(Path(run_dir).parent / ACKS_NAME), **own}
    return own


def _read(path: Path) -> dict[str, dict[str, Any]]:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return {}
    try:
        import stat

        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return {}
        data = os.read(fd, MAX_ACKS_BYTES)
    except OSError:
        return {}
    finally:
        os.close(fd)
    out: dict[str, dict[str, Any]] = {}
    for raw in data.decode("utf-8", "replace").splitlines():
        try:
            rec = json.loads(raw)
        except ValueError:
            continue
        if not isinstance(rec, dict) or not isinstance(rec.get("code"), str):
            continue
        t = rec.get("t")
        out.setdefault(rec["code"], {"by": str(rec.get("by") or "?")[:200],
                                     "t": t if isinstance(t, (int, float)) and not isinstance(t, bool) else None,
                                     "why": str(rec.get("why") or "")[:MAX_WHY]})
    return out


def mark_acked(findings: list[dict[str, Any]], acks: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The findings with `acked` set on those whose code was acknowledged (copies; the rest as they are)."""
    if not acks:
        return findings
    return [{**f, "acked": acks[f["code"]]} if f.get("code") in acks else f for f in findings]


def _who() -> str:
    try:
        user = getpass.getuser()
    except Exception:  # no user name in a container without a passwd entry
        user = str(os.getuid()) if hasattr(os, "getuid") else "?"
    return f"{user}@{platform.node()}"
