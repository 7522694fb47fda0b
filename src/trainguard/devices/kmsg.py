"""The kernel log, followed while the run trains: lines that speak of the GPU, memory or stuck tasks.

    follower = KernelLog.open()            # None where /dev/kmsg cannot be read (no CAP_SYSLOG, a container)
    for event in follower.read():          # non-blocking: what came since the last read, parsed
        ...

/dev/kmsg gives one record per read, `PRI,SEQ,USEC,FLAGS;message`; opened non-blocking and moved to its end,
it gives only what is logged from now on, and EAGAIN when there is nothing new. A reader that falls behind
gets EPIPE (records were overwritten) and simply goes on. `parse_line` also reads `dmesg` lines, so tests
and the offline readers share it.
"""

from __future__ import annotations

import errno
import os
import re
from typing import Any

from trainguard.devices.xid import describe

MAX_RECORD = 8192
MAX_PER_READ = 256  # records taken per read: a flood of kernel messages costs a bounded pass

_XID = re.compile(r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9a-fA-F:.]+)\): (?P<xid>\d+)(?:, pid=(?P<pid>\d+|'<unknown>'))?"
                  r"(?:, name=(?P<name>[^,]*))?(?:, (?P<rest>.*))?")
_OOM = re.compile(r"Out of memory: Killed process (?P<pid>\d+) \((?P<name>[^)]*)\)|oom-kill:.*task=(?P<name2>[^,]+),"
                  r"pid=(?P<pid2>\d+)")
_HUNG = re.compile(r"INFO: task (?P<name>.+?):(?P<pid>\d+) blocked for more than (?P<secs>\d+) seconds")


def parse_line(line: str) -> dict[str, Any] | None:
    """A device event's data from one kernel-log line, or None when the line is not one trainguard reads."""
    m = _XID.search(line)
    if m:
        number = int(m["xid"])
        meaning, serious = describe(number)
        pid = m["pid"]
        return {"source": "kernel", "what": "xid", "xid": number, "pci": normal_pci(m["pci"]), "serious": serious,
                "pid": int(pid) if pid and pid.isdigit() else None, "meaning": meaning,
                "text": f"Xid {number} ({meaning}) on GPU {normal_pci(m['pci'])}", "line": line.strip()[:300]}
    m = _OOM.search(line)
    if m:
        pid = m["pid"] or m["pid2"]
        name = m["name"] or m["name2"]
        return {"source": "kernel", "what": "oom-killer", "pid": int(pid), "serious": False,
                "text": f"the kernel's OOM killer killed process {pid} ({name}): host memory ran out",
                "line": line.strip()[:300]}
    m = _HUNG.search(line)
    if m:
        return {"source": "kernel", "what": "hung-task", "pid": int(m["pid"]), "serious": False,
                "text": f"task {m['name']} (pid {m['pid']}) blocked for more than {m['secs']} s (usually I/O)",
                "line": line.strip()[:300]}
    return None


def normal_pci(bus_id: str) -> str:
    """A PCI bus id as NVML and the kernel both can be compared in: 'dddd:bb:dd' lower-case, no function."""
    text = bus_id.strip().lower()
    parts = text.split(":")
    if len(parts) == 2:  # "3b:00" -> domain 0
        parts = ["0000", *parts]
    if len(parts) >= 3:
        domain = parts[0][-4:].rjust(4, "0")
        bus = parts[1][-2:].rjust(2, "0")
        dev = parts[2].split(".")[0][-2:].rjust(2, "0")
        return f"{domain}:{bus}:{dev}"
    return text


class KernelLog:
    """/dev/kmsg, non-blocking, from its end."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    @classmethod
    def open(cls, path: str = "/dev/kmsg") -> KernelLog | None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError:
            return None
        try:
            os.lseek(fd, 0, os.SEEK_END)
        except OSError:
            pass
        log = cls(fd)
        try:  # readable in principle but refused on read (dmesg_restrict): off
            os.read(fd, MAX_RECORD)
        except BlockingIOError:
            pass
        except OSError as exc:
            if exc.errno not in (errno.EPIPE, errno.EAGAIN):
                log.close()
                return None
        return log

    def read(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for _ in range(MAX_PER_READ):
            try:
                raw = os.read(self.fd, MAX_RECORD)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:
                    continue  # records were overwritten before we read them: go on with the next
                break
            if not raw:
                break
            # one record per read from /dev/kmsg; a pipe or a file (the tests) may give several. A line
            # opening with a space is a record's KEY=value continuation
            for line in raw.decode("utf-8", "replace").splitlines():
                head, sep, message = line.partition(";")
                if not sep or line.startswith(" ") or "," not in head:
                    continue
                event = parse_line(message)
                if event is not None:
                    out.append(event)
        return out

    def close(self) -> None:
        try:
            os.close(self.fd)
        except OSError:
            pass
