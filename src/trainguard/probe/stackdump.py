"""Stacks on request: a signal makes this process write every thread's Python stack into the run folder.

    stackdump.install(run_dir)        # the probe calls this once, in the training process

Why a signal and `faulthandler`: the watchdog needs the stacks of a process that may be stuck in a lock,
a blocking `open()` or a busy loop that never returns to the interpreter's signal check. faulthandler's
handler is C code that runs inside the signal handler itself and walks every thread's frames without
the GIL, so it answers in all of those cases, needs no ptrace rights (py-spy does) and costs nothing
until the signal comes.

What gets the handler:
- the process that calls `install` (the training process, each rank);
- its forked children (DataLoader workers with the default start method on Linux): `os.register_at_fork`
  re-installs it into a file of the child's own, so a worker's dump never lands in its parent's file;
- spawned children that import trainguard (spawn/forkserver DataLoader workers import the main module,
  ranks started by a launcher): `install` leaves `TRAINGUARD_STACKS` in the environment and
  `trainguard/__init__.py` calls `install_from_env()`.

Each process writes `stacks/proc-<pid>.txt` (the dumps, appended) and `stacks/proc-<pid>.json` (who it
is, which signal to send, the main thread's id). The watchdog sends the signal only to a process whose
`/proc/PID/status` shows the signal caught: an uncaught real-time signal would kill the process.
Fail-open: anything that goes wrong here leaves the process as it was.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

from trainguard.contract import ENV_STACKS

# Only the standard library's lightest modules at import: under `trainguard run` the bootstrap loads this
# file into every Python process of the run, at interpreter start-up (see probe/auto.py).

# A real-time signal nobody else uses by default (not SIGUSR1/2, which launchers and Lightning take).
# None where there are no real-time signals (macOS, Windows): no handler, py-spy stays the only source.
STACK_SIGNAL = signal.SIGRTMIN + 6 if hasattr(signal, "SIGRTMIN") else None

TYPE_CHECKING = False  # as in contract.py: this module is loaded at start-up, `typing` is not imported
if TYPE_CHECKING:
    from typing import TextIO, TypedDict

    class _State(TypedDict):
        dir: str | None  # the folder this process writes its dumps into
        pid: int | None  # the process that registered (a forked child registers again)
        file: TextIO | None  # the open dump file, kept alive for faulthandler's fd
        fork_hook: bool

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_state: _State = {"dir": None, "pid": None, "file": None, "fork_hook": False}


def install(run_dir: str | os.PathLike) -> bool:
    """Installs the stack-dump handler in this process and arranges it for children. True when installed."""
    try:
        folder = os.path.join(os.fspath(run_dir), "stacks")
        try:
            os.mkdir(folder, 0o755)
        except FileExistsError:
            pass
        if os.path.islink(folder) or not os.path.isdir(folder):
            return False  # a link planted in the run folder is never followed (folderio.py): no dumps
        folder = os.path.realpath(folder)
        os.environ[ENV_STACKS] = folder
        ok = _register(folder)
        if not _state["fork_hook"]:
            os.register_at_fork(after_in_child=_after_fork_in_child)
            _state["fork_hook"] = True
            threading.Thread(target=_prune_forever, args=(folder,), name="trainguard-stacks-prune",
                             daemon=True).start()
        return ok
    except Exception:
        return False  # the guard never becomes the failure: no handler, py-spy stays the fallback


def install_from_env() -> bool:
    """In a child started with TRAINGUARD_STACKS set (a spawned worker or rank): install the handler."""
    folder = os.environ.get(ENV_STACKS)
    if not folder or _state["pid"] == os.getpid():
        return False
    try:
        ok = _register(folder)
        if not _state["fork_hook"]:
            os.register_at_fork(after_in_child=_after_fork_in_child)
            _state["fork_hook"] = True
        return ok
    except Exception:
        return False


def _register(folder: str) -> bool:
    import faulthandler

    if STACK_SIGNAL is None:
        return False

    previous = signal.getsignal(STACK_SIGNAL)
    # (SIG_IGN is ours too: a process started by a probed one inherits it through exec, see below)
    if previous not in (signal.SIG_DFL, signal.SIG_IGN, None) and _state["pid"] is None:
        return False  # the script uses this signal itself: leave it alone
    pid = os.getpid()
    # O_NOFOLLOW: a link planted in the stacks folder is refused, never written through (folderio.py's rule,
    # written out here: this module is loaded at start-up and imports almost nothing)
    dump_path = os.path.join(folder, f"proc-{pid}.txt")
    fd = os.open(dump_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | _NOFOLLOW | os.O_NONBLOCK, 0o644)
    fh = os.fdopen(fd, "a", buffering=1)
    if _state["pid"] is None:
        # (only the first time in this interpreter: a forked child keeps faulthandler's handler as it is)
        # faulthandler puts back the handler it found when the interpreter shuts down: make that "ignore",
        # so that a dump asked for at the very moment the process exits cannot kill it (the default action
        # of a real-time signal is to terminate)
        signal.signal(STACK_SIGNAL, signal.SIG_IGN)
    faulthandler.register(STACK_SIGNAL, file=fh, all_threads=True, chain=False)
    old = _state["file"]
    _state.update({"dir": folder, "pid": pid, "file": fh})  # faulthandler keeps the fd, we keep the file object alive
    if old is not None and old is not fh:
        try:
            old.close()  # the parent's file object, inherited over fork: the child must not write to it
        except Exception:
            pass
    info = {
        "pid": pid,
        "ppid": os.getppid(),
        "signal": int(STACK_SIGNAL),
        "file": dump_path,
        "main_thread": f"0x{threading.main_thread().ident or 0:016x}",
        "argv": list(sys.argv),
        "installed": time.time(),
    }
    tmp = os.path.join(folder, f".proc-{pid}.json.tmp")
    try:
        os.unlink(tmp)  # a leftover (or a planted link): removed, never written through
    except FileNotFoundError:
        pass
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o644), "w", encoding="utf-8") as out:
        out.write(_to_json(info))
    os.replace(tmp, os.path.join(folder, f"proc-{pid}.json"))
    return True


def _to_json(info: dict) -> str:
    """`json.dumps` for the sidecar's flat dict of ints and strings (and a list of strings), when the json
    module is not loaded yet: importing it (and `re` with it) at every interpreter start-up cost tens of
    milliseconds per process under the bootstrap."""
    json = sys.modules.get("json")
    if json is not None:
        return json.dumps(info)

    def value(v: object) -> str:
        if isinstance(v, (int, float)):
            return repr(v)
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        text = str(v)
        # escaped: quotes, backslashes, control characters and lone surrogates (an undecodable argv byte)
        return '"' + "".join(f"\\u{ord(c):04x}" if c < " " or c in '"\\' or "\ud800" <= c <= "\udfff" else c
                             for c in text) + '"'

    return "{" + ", ".join(f"{value(k)}: {value(v)}" for k, v in info.items()) + "}"


PRUNE_EVERY = 60.0  # seconds between sweeps of the files of workers that are gone


def prune(folder: str | os.PathLike) -> int:
    """Removes the files of processes that ended without ever dumping (every DataLoader worker of every
    epoch leaves two, so a long run would pile up thousands); returns how many processes were swept."""
    from pathlib import Path

    from trainguard.store.owner import pid_alive

    folder = Path(folder)
    swept = 0
    for info in folder.glob("proc-*.json"):
        pid = int(info.stem.split("-", 1)[1])
        dump = folder / f"proc-{pid}.txt"
        if pid_alive(pid) or (dump.exists() and dump.stat().st_size > 0):
            continue
        info.unlink(missing_ok=True)
        dump.unlink(missing_ok=True)
        swept += 1
    return swept


def _prune_forever(folder: str) -> None:
    while True:
        time.sleep(PRUNE_EVERY)
        try:
            prune(folder)
        except Exception:
            pass  # a failed sweep leaves a few small files; never worth breaking anything for


    return True


def _after_fork_in_child() -> None:
    # Runs in every child forked by Python code (DataLoader workers). Cheap: one open, one small write.
    folder = _state["dir"]
    if folder is None:
        return
    try:
        _register(folder)
    except Exception:
        pass
