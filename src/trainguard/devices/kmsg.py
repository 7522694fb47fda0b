"""The kernel log, followed while the run trains: lines that speak of the GPU, memory or stuck tasks.

    source = open_kernel_log()             # None where nothing of the kernel log can be read: off, silently
    while running:
        if source.wait(1.0):               # bounded: at most the timeout, so the thread can stop
            for event in source.read():    # non-blocking: what came since the last read, parsed
                ...
    source.close()

Where it is read from, the first that works (`open_kernel_log`):

1. TRAINGUARD_KERNEL_LOG=PATH: that file, FIFO or device only (a node's forwarded log, a test's FIFO); "0" off.
2. /dev/kmsg: one record per read, `PRI,SEQ,USEC,FLAGS;message`; opened non-blocking and moved to its end it
   gives only what is logged from now on, and EAGAIN when there is nothing new. A reader that falls behind gets
   EPIPE (records were overwritten) and simply goes on. Needs CAP_SYSLOG where kernel.dmesg_restrict=1.
3. The kernel's ring buffer through syslog(2) (what `dmesg` itself falls back to without /dev/kmsg), polled every
   few seconds, only where the kernel permits it (dmesg_restrict=0 or CAP_SYSLOG; a container's seccomp profile
   may refuse it). Read whole, new lines found after the last one seen; never the destructive read.
4. `journalctl -k -f`, where the journal holds kernel lines this user may read (the adm or systemd-journal
   group); a child process in its own session, ended when the follower closes.

`parse_line` reads a message of any of them (and `dmesg` lines), so tests and the offline readers share it.
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import select
import shutil
import stat
import subprocess
import time
from collections.abc import Mapping
from typing import Any, Protocol

from trainguard.contract import ENV_KERNEL_LOG
from trainguard.devices.xid import describe

MAX_RECORD = 8192
MAX_PER_READ = 256  # records taken per read: a flood of kernel messages costs a bounded pass
MAX_PENDING = 1 << 16  # bytes of an unfinished line kept between reads (a line-stream source)
SYSLOG_EVERY = 3.0  # seconds between two reads of the ring buffer through syslog(2) (each copies it whole)

_XID = re.compile(r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9a-fA-F:.]+)\): (?P<xid>\d+)(?:, pid=(?P<pid>\d+|'<unknown>'))?"
                  r"(?:, name=(?P<name>[^,]*))?(?:, (?P<rest>.*))?")
# mm/oom_kill.c: "%s: Killed process %d (%s) total-vm:..." where %s is "Out of memory", "Memory cgroup out of
# memory" or "Out of memory (oom_kill_allocating_task)"; and its "oom-kill:constraint=...,task=%s,pid=%d,..." line
_OOM = re.compile(r"(?i:out of memory)(?: \([^)]*\))?: Killed process (?P<pid>\d+) \((?P<name>[^)]*)\)"
                  r"|oom-kill:.*task=(?P<name2>[^,]+),pid=(?P<pid2>\d+)")
# kernel/hung_task.c: "INFO: task %s:%d blocked for more than %ld seconds."
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
                "text": f"the kernel's OOM killer killed process {pid} ({name}): memory ran out",
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


class KernelSource(Protocol):
    """The whole surface of a kernel-log source. `wait` returns within its timeout (the follower thread must
    be able to stop); `read` never blocks and never raises for a source that went away (it returns [])."""

    name: str

    def wait(self, timeout: float) -> bool: ...
    def read(self) -> list[dict[str, Any]]: ...
    def close(self) -> None: ...


def open_kernel_log(environ: Mapping[str, str] = os.environ) -> KernelSource | None:
    """The first readable source of the kernel log (see the module's docstring), or None: off, silently."""
    chosen = environ.get(ENV_KERNEL_LOG, "")
    if chosen == "0":
        return None
    if chosen:
        return KernelLog.follow(chosen)
    return KernelLog.open() or SyslogBuffer.open() or JournalFollower.open()


class KernelLog:
    """A file descriptor read non-blocking: /dev/kmsg's records (`records=True`), or plain lines (a FIFO, a file
    appended to, a child's output) of which an unfinished one waits for its end."""

    def __init__(self, fd: int, *, records: bool = True, name: str = "/dev/kmsg", regular: bool = False) -> None:
        self.fd = fd
        self.records = records
        self.name = name
        self.regular = regular  # a regular file is always "ready": it is polled, not selected
        self._pending = b""

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
        log = cls(fd, name=path)
        try:  # readable in principle but refused on read (dmesg_restrict): off
            os.read(fd, MAX_RECORD)
        except BlockingIOError:
            pass
        except OSError as exc:
            if exc.errno not in (errno.EPIPE, errno.EAGAIN):
                log.close()
                return None
        return log

    @classmethod
    def follow(cls, path: str) -> KernelLog | None:
        """A path named by the user: a FIFO (held open for writing too, so a writer that closes is no end of
        it), a regular file (from its end, as `tail -f`), or a character device in /dev/kmsg's format."""
        try:
            mode = os.stat(path).st_mode
        except OSError:
            return None
        if stat.S_ISCHR(mode):
            return cls.open(path)
        try:
            if stat.S_ISFIFO(mode):
                try:
                    fd = os.open(path, os.O_RDWR | os.O_NONBLOCK)
                except OSError:
                    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
                return cls(fd, records=False, name=path)
            if stat.S_ISREG(mode):
                fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
                os.lseek(fd, 0, os.SEEK_END)
                return cls(fd, records=False, name=path, regular=True)
        except OSError:
            return None
        return None

    def wait(self, timeout: float) -> bool:
        if self.regular:
            time.sleep(timeout)
            return True
        try:
            ready, _, _ = select.select([self.fd], [], [], timeout)
        except (OSError, ValueError):
            time.sleep(timeout)
            return False
        return bool(ready)

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
                if not self.regular:
                    time.sleep(0.2)  # a FIFO with no writer reads as ready and empty: do not spin on it
                break
            out.extend(self._lines(raw))
        return out

    def _lines(self, raw: bytes) -> list[dict[str, Any]]:
        if not self.records:
            raw, self._pending = self._pending + raw, b""
            whole, _, rest = raw.rpartition(b"\n")
            self._pending = rest[-MAX_PENDING:]
            raw = whole
        out = []
        for line in raw.decode("utf-8", "replace").splitlines():
            if self.records:
                # one record per read from /dev/kmsg; a line opening with a space is a record's KEY=value
                # continuation
                head, sep, message = line.partition(";")
                if not sep or line.startswith(" ") or "," not in head:
                    continue
                line = message
            event = parse_line(line)
            if event is not None:
                out.append(event)
        return out

    def close(self) -> None:
        try:
            os.close(self.fd)
        except OSError:
            pass


SYSLOG_ACTION_READ_ALL = 3  # (syslog(2): a non-destructive copy of the whole ring buffer)
SYSLOG_ACTION_SIZE_BUFFER = 10


class SyslogBuffer:
    """The kernel's ring buffer through syslog(2), polled: each read copies it whole and parses what follows
    the last line seen. The buffer's history, from before the run, is never parsed."""

    name = "syslog(2)"

    def __init__(self, call: Any, size: int) -> None:
        self._call = call
        self._buf = ctypes.create_string_buffer(size)
        self._last = b""  # the newest line seen (with its timestamp: unique in practice)
        self._next = 0.0

    @classmethod
    def open(cls) -> SyslogBuffer | None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            call = libc.klogctl
            size = call(SYSLOG_ACTION_SIZE_BUFFER, None, 0)
            if size <= 0:
                return None
            log = cls(call, min(size, 16 << 20))
            if log._copy() is None:  # not permitted (dmesg_restrict without CAP_SYSLOG, seccomp): off
                return None
        except (OSError, AttributeError, ValueError):
            return None
        return log

    def _copy(self) -> list[bytes] | None:
        n = self._call(SYSLOG_ACTION_READ_ALL, self._buf, len(self._buf))
        if n < 0:
            return None
        lines = self._buf.raw[:n].splitlines()
        if lines:
            new = lines[len(lines) - _index_after(lines, self._last):] if self._last else []
            self._last = lines[-1]
            return new
        return []

    def wait(self, timeout: float) -> bool:
        delay = max(0.0, min(timeout, self._next - time.monotonic()))
        time.sleep(delay)
        return time.monotonic() >= self._next

    def read(self) -> list[dict[str, Any]]:
        self._next = time.monotonic() + SYSLOG_EVERY
        try:
            lines = self._copy() or []
        except (OSError, ValueError):
            return []
        out = []
        for raw in lines[-MAX_PER_READ:]:
            event = parse_line(raw.decode("utf-8", "replace"))
            if event is not None:
                out.append(event)
        return out

    def close(self) -> None:
        pass


def _index_after(lines: list[bytes], last: bytes) -> int:
    """How many of `lines` follow `last` (all of them if `last` was overwritten meanwhile: the buffer wrapped)."""
    for i in range(len(lines) - 1, -1, -1):
        if lines[i] == last:
            return len(lines) - 1 - i
    return len(lines)


class JournalFollower(KernelLog):
    """`journalctl -k -f` (or another command given, in tests) as a child in its own session, its output read
    non-blocking as lines; the child is ended when the follower closes, and also when this process dies
    without closing it (killed, `os._exit`): it runs under a small shell that holds a pipe from this process
    on its standard input and kills the command once that pipe closes. A follower left behind would wait for
    the next kernel line to notice (and be a leftover process of the run meanwhile)."""

    # the command in the background, `cat` waiting for our end of the pipe to close, then the command killed
    WRAPPER = 'trap "" PIPE; "$@" </dev/null & cat >/dev/null; kill $! 2>/dev/null'

    def __init__(self, proc: subprocess.Popen[bytes], name: str) -> None:
        assert proc.stdout is not None
        super().__init__(proc.stdout.fileno(), records=False, name=name)
        os.set_blocking(self.fd, False)
        self.proc = proc

    @classmethod
    def open(cls, argv: list[str] | None = None) -> JournalFollower | None:  # type: ignore[override]
        if argv is None:
            if shutil.which("journalctl") is None:
                return None
            try:  # the journal holds kernel lines this user may read: else nothing to follow
                probe = subprocess.run(["journalctl", "-k", "-n", "1", "-q", "-o", "cat", "--no-pager"],
                                       capture_output=True, timeout=5, stdin=subprocess.DEVNULL)
            except (OSError, subprocess.SubprocessError):
                return None
            if probe.returncode != 0 or not probe.stdout.strip():
                return None
            argv = ["journalctl", "-k", "-f", "-n", "0", "-q", "-o", "cat", "--no-pager"]
        try:
            proc = subprocess.Popen(["sh", "-c", cls.WRAPPER, "sh", *argv], stdout=subprocess.PIPE,
                                    stderr=subprocess.DEVNULL, stdin=subprocess.PIPE, start_new_session=True)
        except OSError:
            return None
        return cls(proc, " ".join(argv[:3]))

    def read(self) -> list[dict[str, Any]]:
        out = super().read()
        if self.proc.poll() is not None and not out:
            time.sleep(0.5)  # the child ended: nothing more will come (the thread checks its stop flag)
        return out

    def close(self) -> None:
        try:  # the shell and the command: its own process group (start_new_session)
            os.killpg(self.proc.pid, 9)
        except OSError:
            pass
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                try:
                    pipe.close()
                except OSError:
                    pass
        try:
            self.proc.wait(timeout=2)
        except subprocess.SubprocessError:
            pass
