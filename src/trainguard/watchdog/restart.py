"""What to do after a hang: wait, kill, or restart from the newest checkpoint — but never forever.

    trainguard run --on-hang restart --max-restarts 3 -- python train.py

A restart starts the same command again in the same run folder with TRAINGUARD_ATTEMPT=N and, when the
script reported a checkpoint (`guard.checkpoint_saved(path)`) that still exists, TRAINGUARD_RESUME_FROM
set to the newest one (the script reads it as `guard.resume_from`). A hang at the same cause and place as
an earlier attempt's is a deterministic failure: restarting again would only repeat it, so the policy
stops and says so (TG507 hang-repeats).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainguard.contract import EVENT_CHECKPOINT, EVENT_CHECKPOINT_CHECK
from trainguard.errors import UserError
from trainguard.findings import WATCHDOG, Code, Finding

if TYPE_CHECKING:
    from trainguard.store.reader import RunReader

ON_HANG = ("wait", "kill", "restart")


@dataclass
class Decision:
    restart: bool
    resume_from: str | None = None
    finding: Finding | None = None
    note: str = ""


@dataclass
class RestartPolicy:
    on_hang: str = "kill"
    max_restarts: int = 3
    hangs: list[Finding] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.on_hang not in ON_HANG:
            raise UserError(f"--on-hang must be one of {', '.join(ON_HANG)}, got {self.on_hang!r}")
        if self.max_restarts < 0:
            raise UserError(f"--max-restarts must be 0 or more, got {self.max_restarts}")

    def after_hang(self, hang: Finding, checkpoint: str | None) -> Decision:
        """Called when an attempt ended hung; says whether to start another."""
        earlier = next((h for h in self.hangs if same_place(h, hang)), None)
        self.hangs.append(hang)
        if self.on_hang != "restart":
            return Decision(False)
        if earlier is not None:
            return Decision(False, finding=repeats_finding(earlier, hang, restarts=len(self.hangs) - 1,
                                                           checkpoint=checkpoint))
        if len(self.hangs) > self.max_restarts:
            return Decision(False, note=f"not restarting: --max-restarts {self.max_restarts} reached")
        where = f" from checkpoint {checkpoint}" if checkpoint else " from the start (no checkpoint was reported)"
        return Decision(True, resume_from=checkpoint,
                        note=f"restarting (attempt {len(self.hangs)} of at most {self.max_restarts}){where}")


def same_place(a: Finding, b: Finding) -> bool:
    """Two hangs are the same failure when cause and place agree (an unknown place never matches)."""
    return a.cause == b.cause and a.where is not None and a.where == b.where


def newest_checkpoint(events: list[dict[str, Any]]) -> str | None:
    """The newest checkpoint the script reported that still exists, from the store's checkpoint events."""
    for ev in reversed(events):
        path = (ev.get("data") or {}).get("path") or ev.get("name")
        if path and Path(path).exists():
            return str(path)
    return None


def repeats_finding(first: Finding, again: Finding, *, restarts: int, checkpoint: str | None) -> Finding:
    """TG507 hang-repeats: after a restart the run hung again with the same cause at the same place.

    What it detects: `--on-hang restart` restarted a hung run (from its newest checkpoint, if any) and the
    new attempt hung with the same cause and `where` as an earlier one.
    Why it matters: a hang that comes back at the same frame after a restart is deterministic (a dataset
    item that always blocks, a lock order, a collective one rank always skips); restarting it forever burns
    the allocation, as seed 003's manual restarts did.
    Example: hung again after restart 1 (from checkpoint ckpt-20.pt): cause deadlock at
    train.py:31 (train_step), as in attempt 0; stopped restarting.
    What to change: fix the code at `where`; the cause's own fix (in the run-hung finding) says how.
    Known false positives: a transient fault that strikes twice at the same place (a network file system
    that stalls at the same save) looks deterministic; fix the storage rather than restart more.
    """
    ckpt = f" from checkpoint {checkpoint}" if checkpoint else " from the start"
    return Finding.of(
        HANG_REPEATS, step=again.step,
        summary=(f"hung again after restart {restarts}{ckpt}: cause {again.cause} at {again.where}, the same as "
                 "before; the failure repeats, so trainguard stopped restarting"),
        evidence={"first_hang": first.summary, "first_step": first.step, "again_step": again.step,
                  "restarts": restarts, "resumed_from": checkpoint,
                  "frames": (again.evidence or {}).get("frames", [])},
        fix="This hang is deterministic: restarting will not get past it. " + (again.fix or ""),
        cause=again.cause, where=again.where, source="watchdog",
    )


HANG_REPEATS = Code("TG507", "hang-repeats", "error", needs=(WATCHDOG,), page=repeats_finding)


def resume_choice(monitors: list[Any], reader: RunReader, guard_error: Callable[[str], None]) -> tuple[str | None, str]:
    """The newest checkpoint verified good (checkpoints/resume.py), once the verifications in flight ended."""
    from trainguard.checkpoints import resume

    for mon in monitors:
        settle = getattr(mon, "settle", None)
        if settle is not None:
            try:
                settle()
            except Exception as exc:
                guard_error(f"monitor {type(mon).__name__} failed to settle: {exc!r}")
    return resume.resume_choice(reader.events(EVENT_CHECKPOINT), reader.events(EVENT_CHECKPOINT_CHECK))
