"""Stacks of every process of a stalled run, sampled a few times, with what the kernel says about each.

    snap = collect(root_pid, run_dir, samples=2, interval=2.0)
    save(snap, run_dir / "stacks", attempt)

For each process of the run's tree (the command, its children, DataLoader workers) and each sample:
- every thread's Python stack: from the probe's signal-triggered dump (`probe/stackdump.py`) where the
  process has the handler, needing no ptrace rights; else from `py-spy dump` (a dependency), which
  needs ptrace rights over the process (root, or the same user where the kernel allows it);
- CPU % over the interval, scheduler state, RSS, read+written bytes, `/proc/PID/wchan` and
  `/proc/PID/stack` (what the kernel says it waits on) where readable.
Once per snapshot: GPU utilisation and memory (nvidia-smi / rocm-smi where present) and the kernel log
lines that match known signatures (`sysinfo.py`).

Two or more samples tell a process that is stuck (same frame, no CPU) from one that spins (CPU, frames
moving). Everything here is bounded in time and returns what it could read, saying why where it could not.
"""

from __future__ import annotations

import json
import linecache
import os
import re
import shutil
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trainguard.contract import ENV_PY_SPY

MAX_DUMP_BYTES = 8 << 20  # one faulthandler dump of every thread; more is not a dump

SIGNAL_DUMP_WAIT = 1.0  # seconds to wait for a signal-triggered dump to appear
PY_SPY_TIMEOUT = 8.0
BURST_CPU = 15.0  # a process above this CPU % gets a fast burst of extra stack samples
BURST = 4  # extra samples in a burst (signal dumps cost ~20 ms each; py-spy ~200 ms, so it gets 2)


@dataclass
class Frame:
    file: str
    line: int
    function: str
    code: str | None = None
    locals: dict[str, str] | None = None

    def text(self) -> str:
        return f"{self.file}:{self.line} in {self.function}" + (f": {self.code}" if self.code else "")


@dataclass
class ThreadStack:
    ident: str
    name: str | None
    main: bool
    frames: list[Frame]  # outermost first, as in a Python traceback
    active: bool | None = None  # py-spy says whether the thread was running


@dataclass
class ProcSample:
    pid: int
    ppid: int | None = None
    cmdline: list[str] = field(default_factory=list)
    rank: str | None = None  # RANK from the process's environment, where readable
    status: str | None = None
    cpu_percent: float | None = None
    rss_mb: float | None = None
    io_bytes: int | None = None  # wchar: bytes written through syscalls so far (a save in progress moves it)
    read_bytes: int | None = None  # rchar: bytes read through syscalls so far (a download in progress moves it)
    wchan: str | None = None
    kernel_stack: list[str] | None = None
    threads: list[ThreadStack] = field(default_factory=list)
    burst: list[Frame] = field(default_factory=list)  # a busy process: its innermost user frame, re-sampled fast
    source: str | None = None  # "signal" (the probe's dump) | "py-spy" | None (no stacks)
    error: str | None = None  # why there are no stacks

    @property
    def main_thread(self) -> ThreadStack | None:
        return next((t for t in self.threads if t.main), self.threads[0] if self.threads else None)

    @property
    def is_dataloader_worker(self) -> bool:
        return any(f.file.endswith("torch/utils/data/_utils/worker.py") and f.function.endswith("_worker_loop")
                   for t in self.threads for f in t.frames)


@dataclass
class Snapshot:
    root_pid: int
    samples: list[dict[int, ProcSample]]
    interval: float
    taken_at: float
    gpu: dict[str, Any] = field(default_factory=dict)
    kernel: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    def last(self, pid: int) -> ProcSample | None:
        for sample in reversed(self.samples):
            if pid in sample:
                return sample[pid]
        return None

    def pids(self) -> list[int]:
        seen: list[int] = []
        for sample in self.samples:
            seen.extend(p for p in sample if p not in seen)
        return seen

    def to_dict(self) -> dict[str, Any]:
        return {"root_pid": self.root_pid, "interval": self.interval, "taken_at": self.taken_at,
                "seconds": round(self.seconds, 2), "gpu": self.gpu, "kernel": self.kernel,
                "samples": [{str(pid): asdict(p) for pid, p in s.items()} for s in self.samples]}


# -- collecting --------------------------------------------------------------------------------------


def collect(root_pid: int, run_dir: Path, *, samples: int = 2, interval: float = 2.0,
            py_spy: str | None = None) -> Snapshot:
    """Samples the stacks and state of `root_pid` and all its descendants `samples` times."""

    from trainguard.watchdog import sysinfo

    t0 = time.time()
    stacks_dir = Path(run_dir) / "stacks"
    spy = py_spy if py_spy is not None else find_py_spy()
    procs: dict[int, Any] = {}
    out: list[dict[int, ProcSample]] = []
    for i in range(samples):
        if i:
            time.sleep(interval)
        for p in _tree(root_pid):
            if p.pid not in procs:
                procs[p.pid] = p
                _safe(lambda p=p: p.cpu_percent(None))  # primes the counter; the next call measures
        if i == 0 and samples > 1:
            # CPU % needs an interval: prime now, measure over a short first wait.
            time.sleep(min(0.5, interval))
        sample: dict[int, ProcSample] = {}
        for pid, p in list(procs.items()):
            if not p.is_running():
                continue
            s = _proc_state(p)
            _stacks_into(s, stacks_dir, spy)
            if (s.cpu_percent or 0) >= BURST_CPU and s.threads:
                _burst(s, stacks_dir, spy)
            sample[pid] = s
        out.append(sample)
    snap = Snapshot(root_pid=root_pid, samples=out, interval=interval, taken_at=t0)
    snap.gpu = sysinfo.gpu_info()
    snap.kernel = sysinfo.kernel_signatures()
    snap.seconds = time.time() - t0
    return snap


def _tree(root_pid: int) -> list[Any]:
    import psutil

    try:
        root = psutil.Process(root_pid)
        return [root] + root.children(recursive=True)
    except psutil.Error:
        return []


def _proc_state(p: Any) -> ProcSample:
    import psutil

    s = ProcSample(pid=p.pid)
    try:
        with p.oneshot():
            s.ppid = p.ppid()
            s.cmdline = p.cmdline()
            s.status = p.status()
            s.rss_mb = round(p.memory_info().rss / 2**20, 1)
    except psutil.Error as exc:
        s.error = f"process gone or unreadable: {type(exc).__name__}"
        return s
    s.rank = (_safe(p.environ) or {}).get("RANK")
    s.cpu_percent = _safe(lambda: round(p.cpu_percent(None), 1))
    s.io_bytes, s.read_bytes = _io_bytes(p.pid), _io_bytes(p.pid, "rchar")
    s.wchan = _read(f"/proc/{p.pid}/wchan")
    if s.wchan in ("0", ""):
        s.wchan = None
    kstack = _read(f"/proc/{p.pid}/stack")
    if kstack:
        s.kernel_stack = [ln.split("] ", 1)[-1] for ln in kstack.splitlines()][:16]
    return s


def _io_bytes(pid: int, field: str = "wchar") -> int | None:
    text = _read(f"/proc/{pid}/io")
    if not text:
        return None
    vals = dict(line.split(": ", 1) for line in text.splitlines() if ": " in line)
    try:
        return int(vals.get(field, 0))
    except ValueError:
        return None


def _stacks_into(s: ProcSample, stacks_dir: Path, spy: str | None) -> None:
    if s.status in ("stopped", "tracing-stop"):
        # a stopped process runs no signal handler, and py-spy cannot attach to it: neither is asked, and
        # the reason is the state itself (not "no ptrace rights", which is what py-spy would say)
        s.error = f"pid {s.pid} is stopped (state {'t' if s.status == 'tracing-stop' else 'T'}): no stack until SIGCONT"
        return
    info = _handler_info(stacks_dir, s.pid)
    if info is not None and catches_signal(s.pid, int(info["signal"])):
        threads = signal_dump(s.pid, Path(info["file"]), int(info["signal"]), info.get("main_thread"))
        if threads:
            s.threads, s.source = threads, "signal"
            return
        s.error = "the probe's stack dump did not answer"
    if not spy:
        s.error = s.error or "no stack source: the probe is not in this process and py-spy is not installed"
        return
    threads, err = py_spy_dump(s.pid, spy)
    if threads:
        s.threads, s.source, s.error = threads, "py-spy", None
    else:
        s.error = (s.error + "; " if s.error else "") + (err or "py-spy returned no stacks")


def _burst(s: ProcSample, stacks_dir: Path, spy: str | None) -> None:
    """Spinning code moves between the lines of its loop: a few quick samples show the whole loop."""
    from trainguard.rules.crash import is_user_frame

    n = BURST if s.source == "signal" else 2
    for _ in range(n):
        time.sleep(0.05)
        if s.source == "signal":
            info = _handler_info(stacks_dir, s.pid) or {}
            threads = signal_dump(s.pid, Path(info.get("file", "")), int(info.get("signal", 0)),
                                  info.get("main_thread")) if info else []
        else:
            threads = py_spy_dump(s.pid, spy)[0] if spy else []
        main = next((t for t in threads if t.main), None)
        user = [f for f in (main.frames if main else []) if is_user_frame(f.file)]
        if user:
            s.burst.append(user[-1])


def _handler_info(stacks_dir: Path, pid: int) -> dict[str, Any] | None:
    from trainguard.errors import UserError
    from trainguard.folderio import read_capped

    try:
        info = json.loads(read_capped(stacks_dir / f"proc-{pid}.json", 1 << 20, "stack-dump sidecar"))
    except (OSError, ValueError, UserError):
        return None
    if not isinstance(info, dict) or isinstance(info.get("signal"), bool) or not isinstance(info.get("signal"), int) \
            or not 0 < info["signal"] < 128:
        return None  # damaged or planted: no signal of ours to send
    # the dump file is this process's own in the same folder, whatever a (damaged or planted) sidecar says
    return {**info, "file": str(stacks_dir / f"proc-{pid}.txt")}


def catches_signal(pid: int, signum: int) -> bool:
    """True when the process has a handler for `signum` (SigCgt in /proc/PID/status): safe to send it."""
    text = _read(f"/proc/{pid}/status") or ""
    m = re.search(r"^SigCgt:\s*([0-9a-fA-F]+)", text, re.M)
    return m is not None and bool(int(m.group(1), 16) >> (signum - 1) & 1)


def signal_dump(pid: int, path: Path, signum: int, main_ident: str | None) -> list[ThreadStack]:
    """Sends the dump signal and parses what the process appended to its file."""
    try:
        start = path.stat().st_size
    except OSError:
        start = 0
    try:
        os.kill(pid, signum)
    except OSError:
        return []
    deadline = time.time() + SIGNAL_DUMP_WAIT
    size, stable = start, 0
    while time.time() < deadline:
        time.sleep(0.02)
        try:
            now = path.stat().st_size
        except OSError:
            return []
        if now > start and now == size:
            stable += 1
            if stable >= 2:  # unchanged for two polls: the dump is complete
                break
        else:
            stable = 0
        size = now
    from trainguard.errors import UserError
    from trainguard.folderio import open_fd

    try:  # never through a link, never more than MAX_DUMP_BYTES
        fd = open_fd(path, "stack dump")
    except UserError:
        return []
    try:
        os.lseek(fd, start, os.SEEK_SET)
        text = os.read(fd, MAX_DUMP_BYTES).decode("utf-8", "replace")
    except OSError:
        return []
    finally:
        os.close(fd)
    return parse_faulthandler(text, main_ident)


_FH_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+)(?: \[(?P<name>[^\]]*)\])? \(most recent call first\):")
_FH_FRAME = re.compile(r'^\s+File "(?P<file>.*)", line (?P<line>\d+) in (?P<func>.+)$')


def parse_faulthandler(text: str, main_ident: str | None = None) -> list[ThreadStack]:
    """Threads from a faulthandler dump ("Thread 0x... (most recent call first):" blocks)."""
    threads: list[ThreadStack] = []
    current: ThreadStack | None = None
    main_int = int(main_ident, 16) if main_ident else None
    for line in text.splitlines():
        m = _FH_THREAD.match(line)
        if m:
            ident = m.group(2)
            current = ThreadStack(ident=ident, name=m.group("name"), main=int(ident, 16) == main_int, frames=[])
            threads.append(current)
            continue
        m = _FH_FRAME.match(line)
        if m and current is not None:
            current.frames.insert(0, _frame(m["file"], int(m["line"]), m["func"]))
    if threads and not any(t.main for t in threads):
        # no id to match (a process started without the sidecar): the thread running <module> is main
        for t in threads:
            if t.frames and t.frames[0].function == "<module>":
                t.main = True
                break
    return threads




def find_py_spy() -> str | None:
    """py-spy next to this interpreter (a default dependency where wheels exist), else on PATH."""
    import sys

    if os.environ.get(ENV_PY_SPY, "1") == "0":
        return None
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


_DENIED = re.compile(r"ermission denied|Operation not permitted|ptrace", re.IGNORECASE)


def py_spy_error(pid: int, text: str, returncode: int) -> str:
    """The reason in py-spy's error output (its Rust backtrace left out); a refused ptrace said so plainly."""
    text = text.split("Stack backtrace:", 1)[0]
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip() and ln.strip() != "Caused by:"]
    why = lines[0] if lines else f"exit code {returncode}"
    denied = next((ln for ln in lines if _DENIED.search(ln)), None)
    if denied is not None:
        why = f"py-spy has no ptrace rights over pid {pid} ({why}: {denied})" if denied != why else \
            f"py-spy has no ptrace rights over pid {pid} ({why})"
    return why[:300]


def py_spy_dump(pid: int, spy: str) -> tuple[list[ThreadStack], str | None]:
    """Threads of `pid` as py-spy sees them (locals included, for a sample index); ([], why) on failure."""
    try:
        out = subprocess.run([spy, "dump", "--pid", str(pid), "--json", "--locals"], capture_output=True,
                             text=True, timeout=PY_SPY_TIMEOUT)
    except (OSError, subprocess.SubprocessError) as exc:
        return [], f"py-spy failed: {exc}"
    if out.returncode != 0:
        return [], py_spy_error(pid, out.stderr or out.stdout, out.returncode)
    try:
        data = json.loads(out.stdout)
    except ValueError:
        return [], "py-spy printed no JSON"
    threads = []
    for t in data:
        frames = [_frame(f.get("filename") or f.get("short_filename") or "?", int(f.get("line") or 0),
                         _bare(f.get("name") or "?"),
                         {v["name"]: v.get("repr", "")[:80] for v in f.get("locals") or [] if v.get("arg")})
                  for f in reversed(t.get("frames") or [])]
        threads.append(ThreadStack(ident=f"0x{t.get('thread_id', 0):016x}", name=t.get("thread_name"),
                                   main=t.get("os_thread_id") == pid, frames=frames, active=t.get("active")))
    return threads, None


def _bare(name: str) -> str:
    # py-spy on 3.11+ prints qualified names ("Event.wait"); faulthandler prints the bare name ("wait")
    return name.rsplit(".", 1)[-1] if not name.startswith("<") else name


def _frame(file: str, line: int, func: str, local_vars: dict[str, str] | None = None) -> Frame:
    code = linecache.getline(file, line).strip() or None
    return Frame(file=file, line=line, function=func, code=code, locals=local_vars or None)


# -- saving ------------------------------------------------------------------------------------------


def save(snap: Snapshot, folder: Path, attempt: int | str = 0) -> Path:
    """Writes `hang-<attempt>.json` (everything) and `hang-<attempt>.txt` (for people); returns the .txt path.
    A later look at the same stall is `hang-<attempt>-<look>`."""
    from trainguard.folderio import subdir, write_atomic

    subdir(folder)  # a real folder of the run, never a link planted in its place (OSError otherwise)
    write_atomic(folder / f"hang-{attempt}.json", json.dumps(snap.to_dict(), indent=1, default=str))
    txt = folder / f"hang-{attempt}.txt"
    write_atomic(txt, render(snap))
    return txt


def render(snap: Snapshot) -> str:
    lines = [f"stacks of the run's processes, {len(snap.samples)} sample(s) {snap.interval:.1f} s apart, "
             f"taken {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(snap.taken_at))}"]
    for n, sample in enumerate(snap.samples, 1):
        lines.append(f"\n===== sample {n} =====")
        for s in sample.values():
            role = "DataLoader worker" if s.is_dataloader_worker else ("root" if s.pid == snap.root_pid else "child")
            lines.append(f"\n--- pid {s.pid} ({role}) {' '.join(s.cmdline)[:160]}")
            lines.append(f"    state {s.status}, CPU {s.cpu_percent}%, RSS {s.rss_mb} MB, wchan {s.wchan}, "
                         f"stacks from {s.source or 'nowhere'}" + (f" ({s.error})" if s.error else ""))
            if s.kernel_stack:
                lines.append("    kernel: " + " <- ".join(s.kernel_stack[:6]))
            for t in s.threads:
                tag = "main thread" if t.main else f"thread {t.name or t.ident}"
                lines.append(f"  {tag}" + ("" if t.active is None else (" (active)" if t.active else " (idle)")))
                for f in t.frames:
                    lines.append(f"    {f.text()}")
    if snap.gpu:
        lines.append(f"\nGPU: {json.dumps(snap.gpu)}")
    if snap.kernel:
        lines.append(f"\nkernel log: {json.dumps(snap.kernel)}")
    return "\n".join(lines) + "\n"


def _read(path: str) -> str | None:
    try:
        with open(path) as fh:
            return fh.read().strip()
    except OSError:
        return None


def _safe(fn: Any) -> Any:
    try:
        return fn()
    except Exception:
        return None

