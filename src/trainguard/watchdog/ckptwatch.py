"""The watchdog's checkpoint verification: every checkpoint the run reports, and every file it saw the run
write and close that looks like one, verified outside the training process (checkpoints/verifier.py).

A monitor (watchdog/watchstate.py's `Monitor`): each poll hands new `checkpoint` events and newly closed
files to the verifier and commits the verdicts it recorded (`checkpoint-check` events, stamped with the
watchdog's rank -1 and the reporting rank in their data); the health rules (rules/checkpoints.py) read
them from the store like any event. It returns no findings itself. `settle` lets the verifications in
flight end before a restart chooses its checkpoint; `finish` before the run's verdict.

The child runs in an interpreter that has torch: this one when it can import torch, else the reporting
rank's own (read from the kernel, /proc/PID/exe, for a process of the run's own process group: the run
folder names the pid, but nothing from the folder is ever executed).
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

from trainguard.contract import ENV_VERIFY, EVENT_CHECKPOINT, EVENT_CHECKPOINT_CHECK

SETTLE_WAIT = 120.0  # seconds a restart or the run's end waits for verifications in flight
# seconds between two verifications of files nobody reported (a run that writes many .pt files, a feature
# cache, must not keep a verifier busy): the newest waiting one is verified when the time comes, or at the end
UNREPORTED_EVERY = 30.0
WATCHDOG_RANK = -1
# what a file the run wrote must look like to be verified without being reported
_CKPT_SUFFIX = (".pt", ".pth", ".ckpt", ".safetensors", ".bin")
_CKPT_FOLDER = re.compile(r"^(checkpoint|global_step|step|ckpt)[-_]?\d+$", re.I)


def enabled() -> bool:
    return os.environ.get(ENV_VERIFY, "1") != "0"


class CheckpointWatch:
    def __init__(self) -> None:
        self.event_id = 0
        self.verifier: Any = None
        self.writer: Any = None
        self._waiting: tuple[str, Any] | None = None  # the newest unreported candidate, and the step then
        self._last_unreported = 0.0

    def poll(self, state: Any) -> list[Any]:
        new = state.reader.events(EVENT_CHECKPOINT, since_id=self.event_id)
        if new:
            self.event_id = new[-1]["id"]
        for ev in new:
            data = ev["data"] if isinstance(ev.get("data"), dict) else {}
            path = data.get("path") or ev.get("name")
            if path:
                self._submit(state, str(path), ev.get("step"), rank=ev.get("rank") or 0, pid=ev.get("pid"),
                             t=ev.get("t"))
        for path in state.scratch.get("closed_files") or []:
            target = _candidate(path)
            if target is not None:
                self._waiting = (target, state.step)
        self._unreported(state, force=False)
        if self.writer is not None:
            self.writer.flush()
        return []

    def settle(self, timeout: float = SETTLE_WAIT) -> None:
        if self.verifier is not None:
            self.verifier.settle(timeout)
        if self.writer is not None:
            self.writer.flush()

    def _unreported(self, state: Any, force: bool) -> None:
        now = time.time()
        if self._waiting is not None and (force or now - self._last_unreported >= UNREPORTED_EVERY):
            target, step = self._waiting
            self._waiting, self._last_unreported = None, now
            self._submit(state, target, step, rank=WATCHDOG_RANK, reported=False)

    def finish(self, state: Any) -> list[Any]:
        self.poll(state)
        self._unreported(state, force=True)
        self.settle()
        if self.verifier is not None:
            self.verifier.stop()
        return []

    def _submit(self, state: Any, path: str, step: Any, *, rank: int, reported: bool = True,
                pid: Any = None, t: Any = None) -> None:
        if not enabled():
            return
        if self.verifier is None:
            from trainguard.checkpoints.verifier import Verifier
            from trainguard.store.writer import StoreWriter

            self.writer = StoreWriter(state.run_dir, rank=WATCHDOG_RANK, attempt=getattr(state, "attempt", 0))
            plan = state.reader.meta().get("plan") or {}
            writer = self.writer

            def record(p: str, at: int | None, data: dict[str, Any]) -> None:
                writer.add_event(EVENT_CHECKPOINT_CHECK, p, data, step=at)

            self.verifier = Verifier(record, learning=plan.get("learning") is not False,
                                     python=_interpreter(pid, state.pid))
        self.verifier.submit(path, step if isinstance(step, int) else None, rank=rank, reported=reported,
                             step_checked=reported, t=t if isinstance(t, (int, float)) else None)


def _candidate(path: str) -> str | None:
    """The checkpoint a closed file belongs to: itself (ckpt.pt), its checkpoint-N folder, or None."""
    p = Path(path)
    if _CKPT_FOLDER.match(p.parent.name):
        return str(p.parent)
    if p.suffix in _CKPT_SUFFIX:
        return str(p)
    return None


def _interpreter(pid: Any, group: int) -> str:
    """A Python that can import torch: this one, or the run's own (a live process of its process group)."""
    if importlib.util.find_spec("torch") is not None:
        return sys.executable
    if isinstance(pid, int) and pid > 0:
        try:
            if os.getpgid(pid) == group:
                return os.readlink(f"/proc/{pid}/exe")
        except OSError:
            pass
    return sys.executable  # safetensors alone, or an `unverified` verdict that says torch is missing
