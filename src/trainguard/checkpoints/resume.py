"""Which checkpoint a restart resumes from: the newest one verified good, never one that failed.

    path, note = resume_choice(reader.events("checkpoint"), reader.events("checkpoint-check"))

A checkpoint whose verification failed (poisoned, unloadable, stale, unchanged) is skipped and named in
the note. Where none was verified good but some could not be judged at all (the verifier had no torch,
a format it does not read), the newest of those is used and the note says it was not verified: refusing
a restart because trainguard could not read a format would make the guard the failure.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainguard.checkpoints.judge import FAILED


def resume_choice(checkpoints: list[dict[str, Any]], checks: list[dict[str, Any]],
                  exists: Callable[[str], bool] = lambda p: Path(p).exists()) -> tuple[str | None, str]:
    """(the checkpoint to resume from or None, a sentence on the choice)."""
    status: dict[str, str] = {}
    for c in checks:  # in the order recorded: the last verdict of a path stands
        d: dict[str, Any] = c["data"] if isinstance(c.get("data"), dict) else {}
        if d.get("path"):
            status[str(d["path"])] = str(d.get("status"))
    skipped: list[str] = []
    fallback: str | None = None
    for ev in reversed(checkpoints):
        e: dict[str, Any] = ev["data"] if isinstance(ev.get("data"), dict) else {}
        path = e.get("path") or ev.get("name")
        if not path or not exists(str(path)):
            continue
        path = str(path)
        verdict = status.get(path)
        if verdict == "verified":
            return path, _note(path, "verified", skipped)
        if verdict in FAILED:
            skipped.append(f"{path} ({verdict})")
        elif fallback is None:
            fallback = path
    if fallback is not None:
        return fallback, _note(fallback, "not verified", skipped)
    return None, ("no checkpoint to resume from" + (f" (failed verification: {', '.join(skipped)})" if skipped else ""))


def _note(path: str, how: str, skipped: list[str]) -> str:
    text = f"resuming from {path} ({how})"
    if skipped:
        text += f"; skipped newer checkpoint(s) that failed verification: {', '.join(skipped)}"
    return text
