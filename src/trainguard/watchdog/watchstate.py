"""What the supervisor's monitors see: the run as it is at one poll, and the one method a monitor has.

The supervisor (watchdog/supervisor.py) makes a `WatchState` every half second and hands it to each
`Monitor` (the stall's, the rules', the nodes', the rendezvous', the job limit's...).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from trainguard.findings import Finding
from trainguard.store.reader import RunReader


@dataclass
class WatchState:
    """What a monitor may look at on each poll. This is the whole surface monitors get."""

    run_dir: Path
    reader: RunReader
    pid: int
    started: float
    now: float
    step: int | None
    phase: str | None
    t_progress: float | None
    probe_used: bool
    output_lines: int
    last_output: float | None
    attempt: int = 0
    scratch: dict[str, Any] = field(default_factory=dict)


class Monitor(Protocol):
    """Something the supervisor polls while the run lives; returns new findings (may be empty).

    A monitor must return quickly (it runs on the supervisor's loop) and must not raise for the run's
    sake: the supervisor logs and drops a monitor that raises.
    """

    def poll(self, state: WatchState) -> list[Finding]: ...
