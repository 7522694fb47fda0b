"""The crash hook: an uncaught exception is recorded with the step and phase it happened in.

`install` chains `sys.excepthook` once per process; each guard that is watching (made, not finished) is
told of the exception (`Guard.record_crash`). The same list answers `active_guard()`: the guard watching
this process now, for `watch()`'s one-guard-per-process rule and the automatic probe's retirement.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from typing import Any

from trainguard.contract import EVENT_CRASH
from trainguard.probe import devicestats

_HOOKED: list[Any] = []  # the guards made in this process, oldest first, until they finish or retire


def active_guard() -> Any:
    """The guard watching this process now (made by `watch`, not finished), if any."""
    for g in _HOOKED:
        if not g.finished and g.pid == os.getpid() and not g.state.disabled:
            return g
    return None


def watched_by_script() -> bool:
    """A guard of the script's own `watch()` exists (not the automatic probe's)."""
    return any(not getattr(g, "auto", False) for g in _HOOKED)


def forget(guard: Any) -> None:
    """`guard` finished or retired: a later crash of this process is not its run's."""
    if guard in _HOOKED:
        _HOOKED.remove(guard)


def interrupted() -> None:
    """A KeyboardInterrupt ended the script (uncaught, or caught by trainguard's own CLI): every guard still
    watching records an interrupt."""
    for g in list(_HOOKED):
        if not g.finished:
            g.record_interrupt()


def install(guard: Any) -> None:
    """Chains sys.excepthook so an uncaught exception is recorded with its step and phase."""
    _HOOKED.append(guard)
    if len(_HOOKED) > 1:
        return
    previous = sys.excepthook

    def hook(exc_type: type, exc: BaseException, tb: Any) -> None:
        if issubclass(exc_type, KeyboardInterrupt):
            interrupted()  # Ctrl-C: an interrupt, not a crash
        else:
            for g in list(_HOOKED):
                if not g.finished:
                    g.record_crash(exc_type, exc, tb)
        previous(exc_type, exc, tb)

    sys.excepthook = hook


def record(steps: Any, ending: Any, t0: float, exc_type: type, exc: BaseException, tb: Any) -> None:
    """Writes the crash (first: it is worth more than the last steps), then the last steps, then the ending."""
    steps.state.crashed = True
    frames = [
        {"file": f.filename, "line": f.lineno, "function": f.name, "code": f.line}
        for f in traceback.extract_tb(tb)
    ]
    phases = steps.phases.at(exc)
    data = {
        "exception": exc_type.__name__,
        "message": str(exc)[:2000],
        "frames": frames[-30:],
        "phase": phases[-1] if phases else None,
        "phases": phases,
        "phases_seen": dict(steps.phases.seen),
        "elapsed": time.time() - t0,
        "micro": steps.micro,
    }
    # The crash itself is written first: the last steps are worth less than the crash, and reading
    # them back from a device in an error state can fail.
    steps.writer.add_event(EVENT_CRASH, exc_type.__name__, data, step=steps.step_count)
    steps.writer.flush()
    if devicestats.is_device_error(exc):
        steps.abandon_device(exc)
    try:
        steps.emit_all()
        steps.drain(final=True)
        steps.writer.flush()
    except Exception as exc3:
        steps.fail("crash record (last steps)", exc3)
    ending.crashed(data, frames)

