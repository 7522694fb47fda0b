"""What the kernel says about a process that died: the OOM killer, in dmesg or in cgroup counters.

Both sources are often unreadable (containers, no CAP_SYSLOG); every reader returns what it could read
and says so when it could not, so the finding can tell "the OOM killer did it" from "probably".
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path


def cgroup_oom_kills() -> int | None:
    """oom_kill count of this process's cgroup (v2), or None where unreadable."""
    try:
        rel = Path("/proc/self/cgroup").read_text().strip().splitlines()
        path = None
        for line in rel:
            parts = line.split(":", 2)
            if len(parts) == 3 and parts[0] == "0":
                path = Path("/sys/fs/cgroup") / parts[2].lstrip("/")
        candidates = [p for p in (path, Path("/sys/fs/cgroup")) if p is not None]
        for base in candidates:
            events = base / "memory.events"
            if events.is_file():
                for line in events.read_text().splitlines():
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
    except (OSError, ValueError):
        return None
    return None


def kernel_log_tail(lines: int = 200) -> list[str] | None:
    """The last lines of the kernel log, or None where it cannot be read."""
    try:
        out = subprocess.run(["dmesg", "--ctime"], capture_output=True, text=True, timeout=3)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.splitlines()[-lines:]


_OOM = re.compile(r"(Out of memory|oom-kill|Killed process (?P<pid>\d+))", re.I)


def oom_lines_for(pid: int, log: list[str] | None) -> list[str]:
    if not log:
        return []
    hits = [ln for ln in log if _OOM.search(ln)]
    for_pid = [ln for ln in hits if f"process {pid} " in ln or f"pid={pid}" in ln or f"Killed process {pid}" in ln]
    return for_pid or []
