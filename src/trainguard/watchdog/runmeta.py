"""What the watchdog records about a run before it starts it: the command, where and by whom, and the
watchdog's own settings (the store's meta table, read by `trainguard status`, the report and diagnose).
"""

from __future__ import annotations

import getpass
import os
import platform
import sys
from typing import TYPE_CHECKING, Any

from trainguard import __version__
from trainguard.store.writer import StoreWriter
from trainguard.watchdog.scheduler import SlurmRun

if TYPE_CHECKING:
    from trainguard.watchdog.supervisor import RunOptions


def write_meta(w: StoreWriter, options: RunOptions, started: float, scheduler: SlurmRun | None) -> None:
    w.set_meta("command", options.command)
    w.set_meta("cwd", os.getcwd())
    w.set_meta("started", started)
    w.set_meta("host", platform.node())
    w.set_meta("user", _safe(getpass.getuser))
    w.set_meta("watchdog", {"pid": os.getpid(), "trainguard": __version__, "python": sys.version.split()[0],
                            "platform": platform.platform(), "stall_timeout": options.stall_timeout,
                            "hang_limits": options.hang_limits,
                            "expects": options.expects, "on_hang": options.on_hang,
                            "notify": options.notify})
    w.set_meta("env", {k: os.environ[k] for k in ("CUDA_VISIBLE_DEVICES", "WORLD_SIZE", "SLURM_JOB_ID")
                       if k in os.environ})
    if scheduler is not None:
        w.set_meta("scheduler", scheduler.status())
    w.flush()


def _safe(fn: Any) -> Any:
    try:
        return fn()
    except Exception:
        return None
