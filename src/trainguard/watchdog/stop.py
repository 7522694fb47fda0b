"""When may a stall stop the run? Only on proof that it cannot recover, or past a limit.

    limits = StopLimits(user={"*": 3600.0})
    limits.phase_ended("eval", 140.0)                 # from the probe's phase events
    limits.limit("eval", startup=False, gaps=...)     # -> (seconds, why that number)
    proof(diagnosis)                                   # -> "lock cycle: ..." or None
    stuck(looks, ...)                                  # -> "the same frame in 3 looks over 95 s ..." or None

A stall is a finding (TG509 run-stalled, with stacks, cause and place) as soon as the stall timeout
passes; stopping the run is a separate decision, because a healthy run can be quiet for a long time (a
first evaluation, a slow save, a wait for a file). The run is stopped:

1. at once, when the stacks prove it cannot recover by itself (`proof`): a lock cycle between threads; a
   thread waiting on a lock or an event of its own process that no live thread of it could release; ranks
   waiting in different collectives (or some in none); the loop waiting for a batch while no DataLoader
   worker is alive, or while a worker is blocked on a lock or event that nothing in it can release;
2. when a wait inside the process (a lock, an event) stays at the same place across looks, with no CPU
   spent and nothing read or written, far longer (`STUCK_FACTOR` times, and `STUCK_FLOOR` at least) than the
   longest quiet stretch the run has come through, in a phase it has been through before (`stuck`). A wait on the world (a file, a
   sleep-poll, the GPU, another rank, a DataLoader worker) never counts, nor a process that burns CPU (a
   busy loop looks like a long native computation): the limit decides those;
3. when the stall outlasts its limit (`StopLimits.limit`): `--hang-limit` where the user set one; else,
   like the section timeouts of NVIDIA's resiliency extension, a phase the run has been through gets
   `LIMIT_FACTOR` times its own longest duration (never less than `LIMIT_FLOOR`), and a phase never seen
   before (start-up until the first optimizer step, the first evaluation, the first save) gets
   `NEW_PHASE_LIMIT`: nothing the run did says how long it should take.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trainguard.errors import UserError
from trainguard.watchdog.classify import BUSY_CPU, IO_MOVING_BYTES

NEW_PHASE_LIMIT = 1800.0  # a phase never seen before (the first eval, the first save, start-up)
LIMIT_FACTOR = 5.0  # a phase seen before: this many times its longest duration (or quiet stretch) ...
LIMIT_FLOOR = 600.0  # ... and never less than this
STUCK_FACTOR = 10.0  # "far longer than anything the run has done" ...
STUCK_FLOOR = 120.0  # ... and never less than this (a first download or a first wait has nothing to compare)
MOVED_BYTES = 64 << 10  # read or written between the first look and the last: the wait moves data
ANY_PHASE = "*"
STARTUP = "startup"


def parse_hang_limits(values: list[str] | tuple[str, ...]) -> dict[str, float]:
    """`--hang-limit 3600` (every phase) and `--hang-limit eval=7200` (one phase; `startup` names the
    time before the first optimizer step) into {phase or "*": seconds}."""
    out: dict[str, float] = {}
    for raw in values:
        name, sep, number = str(raw).rpartition("=")
        key = name.strip() if sep else ANY_PHASE
        try:
            seconds = float(number)
        except ValueError:
            raise UserError(f"--hang-limit takes SECONDS or PHASE=SECONDS, got {raw!r}") from None
        if not seconds > 0 or seconds == float("inf"):
            raise UserError(f"--hang-limit must be a positive number of seconds, got {raw!r}")
        if sep and not key:
            raise UserError(f"--hang-limit: the phase name before '=' is empty in {raw!r}")
        out[key] = seconds
    return out


@dataclass
class StopLimits:
    """How long a stall may last before the run is stopped without proof, per phase."""

    user: dict[str, float] = field(default_factory=dict)
    """--hang-limit values: {phase: seconds}, "*" for every phase."""
    longest: dict[str, float] = field(default_factory=dict)
    """The longest completed duration of each phase the run has been through."""

    def phase_ended(self, name: str, seconds: float) -> None:
        if seconds >= 0:
            self.longest[name] = max(self.longest.get(name, 0.0), float(seconds))

    def limit(self, phase: str | None, *, startup: bool, phase_gap: float, gaps_seen: bool) -> tuple[float, str]:
        """Seconds a stall in `phase` may last, and why that number.

        `phase_gap`: the longest quiet stretch learned in this phase (steps outside any phase: phase None);
        `gaps_seen`: whether any were learned in it (a phase with steps inside is not new)."""
        key = STARTUP if startup else (phase or "steps")
        for k in (key, ANY_PHASE):
            if k in self.user:
                return self.user[k], f"--hang-limit {'' if k == ANY_PHASE else k + '='}{self.user[k]:g}"
        own = max(self.longest.get(phase or "", 0.0), phase_gap)
        if startup or (phase is not None and phase not in self.longest and not gaps_seen):
            what = "start-up, no optimizer step yet" if startup else f"phase '{phase}' never seen before"
            return NEW_PHASE_LIMIT, what
        learned = LIMIT_FACTOR * own
        if learned <= LIMIT_FLOOR:
            return LIMIT_FLOOR, f"the floor; {_name(phase)} took at most {own:.3g} s before"
        return learned, f"{LIMIT_FACTOR:g} x the longest the {_name(phase)} took before, {own:.3g} s"


def _name(phase: str | None) -> str:
    return f"phase '{phase}'" if phase else "steps"


def proof(diagnosis: Any) -> str | None:
    """Why the stall cannot end by itself, from one look's diagnosis, or None when it might."""
    extra = diagnosis.extra or {}
    return extra.get("unrecoverable")


def stuck(looks: list[Any], *, idle: float, longest_done: float, phase_seen: bool) -> str | None:
    """Proof by persistence: a wait inside the process (a lock, an event, a condition that no look could
    prove unreleasable, e.g. because another thread sits in user code) at the same place in every look,
    with no CPU spent and nothing read or written, for `STUCK_FACTOR` times longer than the longest quiet stretch
    the run came through, in a phase it has been through before. `looks` are this stall's StallDiagnosis.

    A process that burns CPU is left to the limit: a busy loop and a long native computation look alike
    (the same frame, no I/O), and the second is healthy. A wait on the world (a file, a sleep, the GPU,
    another rank, a DataLoader worker) is left to the limit too: the world may answer."""
    if len(looks) < 2 or not phase_seen or longest_done <= 0:
        return None
    if {lk.diagnosis.cause for lk in looks} != {"deadlock"}:
        return None
    if any((lk.cpu_percent or 0.0) >= BUSY_CPU for lk in looks):
        return None
    if any(lk.io_bytes_moved >= IO_MOVING_BYTES for lk in looks) or _read_between(looks) >= MOVED_BYTES:
        return None  # (the probe's own heartbeat writes a little all the time: only a real write counts)
    places = {lk.diagnosis.where for lk in looks}
    if len(places) != 1 or None in places:
        return None
    if idle < max(STUCK_FACTOR * longest_done, STUCK_FLOOR):
        return None
    d = looks[-1].diagnosis
    return (f"the same wait ({d.where}) in {len(looks)} looks, no CPU spent, nothing written, for {idle:.0f} s: "
            f"more than {STUCK_FACTOR:g} x the longest quiet stretch the run came through ({longest_done:.3g} s)")


def _read_between(looks: list[Any]) -> int:
    """Bytes the run read between the first look and the last (a download that still flows)."""
    first, last = getattr(looks[0], "tree_io", None), getattr(looks[-1], "tree_io", None)
    if first is None or last is None:
        return 0
    return max(0, last[1] - first[1])
