"""Why a stalled run is stuck: a cause, the place in the user's code, the frames that show it, and a fix.

    diag = diagnose(snapshot)      # snapshot from stacks.collect
    diag.cause, diag.where, diag.frames, diag.fix

Causes, tried in this order (the first that fits wins, because the later ones are symptoms of the
earlier: a rank waiting in an all-reduce is also "idle in a futex"):
- collective:        a training process waits inside a torch.distributed collective, or in one its stack
                     does not show, known from its flight recorder (watchdog/collectives.py): DDP's
                     all-reduce inside backward, or under NCCL a collective its GPU waits in while the host
                     waits for the GPU (`.item()`, `guard.finish()`);
- dataloader-worker: the training process waits for a batch; the worker's stack names the dataset frame;
- busy-loop:         the training process burns CPU and its stack stays in the same user code;
- computing:         it burns CPU inside torch's own code (a forward, an autograd pass) called from the
                     user's code: a long computation reporting no progress (a healthy 68 s evaluation
                     outside a marked phase), not a spin;
- device-sync:       it waits for the GPU (.item(), .cpu(), synchronize) on a machine with a GPU;
- io:                it waits on a file: open/read/write/torch.save, a FIFO or pipe, uninterruptible sleep;
- deadlock:          it waits for a lock or an event that no live thread of the process will release/set;
- sleep:             it sleeps (time.sleep), usually polling for something that never comes;
- unknown:           no stack could be read, or none of the above fits (the stacks are still saved).

`where` is the innermost frame in the user's code (not the standard library, not site-packages, not
trainguard) of the thread that shows the cause; for a DataLoader worker, the dataset frame and the sample
index where py-spy could read it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from trainguard.contract import PROBE_DEVICE_WAIT
from trainguard.rules.crash import is_user_frame
from trainguard.watchdog.stacks import Frame, ProcSample, Snapshot, ThreadStack

CAUSES = ("dataloader-worker", "collective", "deadlock", "busy-loop", "computing", "device-sync", "io", "sleep",
          "stopped", "unknown")
BUSY_CPU = 15.0  # percent of one core: above this, a process that makes no progress is spinning (low,
# because on a loaded machine a spinning loop may get a fraction of a core; a blocked process gets ~0)
IO_MOVING_BYTES = 1 << 20  # bytes written during the sampling window that mean "slow, not stuck"

_COLLECTIVE_FILES = ("torch/distributed/distributed_c10d.py", "torch/distributed/c10d_logger.py")
_DATALOADER_NEXT = ("__next__", "_next_data", "_get_data", "_try_get_data")
_LOCK_CODE = re.compile(r"\bwith\b[^:]*(lock|mutex)\w*|\.acquire\(", re.I)
_SLEEP_CODE = re.compile(r"\bsleep\(")
_IO_CODE = re.compile(r"\b(open|torch\.save|save|write|read|readline|fsync|flush|copyfile|copy2|dump|load)\(")
_SYNC_CODE = re.compile(r"\.(item|cpu|tolist|numpy)\(\)|synchronize\(|\.to\(['\"]cpu")
_IO_FILES = ("torch/serialization.py", "/shutil.py", "/pickle.py", "/_pyio.py", "/tempfile.py")
_IO_WCHAN = re.compile(r"pipe_|fifo|wait_for_partner|nfs|rpc_|fuse|io_schedule|folio|wait_on_page|blk|jbd2|ext4|xfs")
_WAIT_FUNCS = {"wait", "get", "join", "acquire", "poll", "select", "_recv_bytes", "recv", "_poll"}
_CHILD_WAIT = re.compile(r"subprocess\.py|multiprocessing/(popen_\w+|process)\.py|torch/multiprocessing/spawn\.py")


@dataclass
class Diagnosis:
    cause: str
    where: str | None
    detail: str
    fix: str
    frames: list[str] = field(default_factory=list)
    pid: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def diagnose(snap: Snapshot, waits: dict[int, str] | None = None) -> Diagnosis:
    """The cause of a stall, from the last sample (earlier samples decide stuck vs. spinning).

    `waits`: rank -> the collective it waits in where its Python stack cannot show it (inside
    `loss.backward()`, DDP's gradient all-reduce, known from its flight recorder: watchdog/collectives.py)."""
    last = snap.samples[-1] if snap.samples else {}
    procs = list(last.values())
    workers = [p for p in procs if p.is_dataloader_worker]
    others = [p for p in procs if not p.is_dataloader_worker]
    trainers = [p for p in others if p.threads and not _waits_on_children(p)]
    if not trainers:
        trainers = [p for p in others if p.threads]
    if len(trainers) == len(others):  # no process but launchers: the workers are gone
        barrier = _exit_barrier(trainers)
        if barrier is not None:
            return barrier
    stopped = _stopped(procs)
    if stopped is not None:  # nothing else can be read of a stopped process, and nothing else is wrong yet
        return stopped
    for check in (_collective, _dataloader, _busy, _blocked):
        diag = _collective(snap, trainers, workers, waits or {}) if check is _collective else check(snap, trainers, workers)
        if diag is not None:
            return diag
    unread = "; ".join(f"pid {p.pid}: {p.error}" for p in procs if p.error) or (
        f"{len(procs)} process(es) looked at, their stacks are in stacks/" if procs else "no process of the run was found")
    return Diagnosis(cause="unknown", where=None, detail=f"no stack showed a known cause ({unread})",
                     fix=FIXES["unknown"])


STOPPED_STATES = ("stopped", "tracing-stop")  # psutil's names for /proc's T and t states


def _stopped(procs: list[ProcSample]) -> Diagnosis | None:
    """A process of the run in state T (SIGSTOP, SIGTSTP from Ctrl-Z, SIGTTIN/SIGTTOU from a terminal) or t
    (a debugger holds it): it runs no code until it is continued, so it answers no stack dump and py-spy
    cannot attach. Named as such, not as a missing ptrace right."""
    for p in sorted(procs, key=lambda q: q.is_dataloader_worker):
        if p.status in STOPPED_STATES:
            how = "held by a debugger (state t)" if p.status == "tracing-stop" else \
                "stopped by a signal (state T: SIGSTOP, or SIGTSTP from Ctrl-Z)"
            role = "a DataLoader worker" if p.is_dataloader_worker else "the process"
            return Diagnosis(cause="stopped", where=None, pid=p.pid, fix=FIXES["stopped"],
                             detail=f"{role} pid {p.pid} is {how}: it runs nothing until it gets SIGCONT")
    return None


def _exit_barrier(launchers: list[ProcSample]) -> Diagnosis | None:
    """torchrun's agent whose workers are done waits in its exit barrier for the other nodes' agents
    (`_exit_barrier -> store.wait`, up to 300 s): not a hang of this node, a node that is late or lost."""
    for p in launchers:
        t = p.main_thread
        frame = next((f for f in t.frames if f.function == "_exit_barrier" and "elastic/agent/" in f.file),
                     None) if t is not None else None
        if frame is not None:
            return Diagnosis(
                cause="exit-barrier", where=_where(frame), pid=p.pid, frames=_frames(t), fix=FIXES["exit-barrier"],
                detail=f"torchrun's agent (pid {p.pid}) waits in its exit barrier for the other nodes' agents: "
                       "the workers here are done")
    return None


def io_moving(snap: Snapshot) -> int:
    """Bytes the run's processes read and wrote between the first and last sample (a slow save moves)."""
    if len(snap.samples) < 2:
        return 0
    first, last = snap.samples[0], snap.samples[-1]
    moved = 0
    for pid, s in last.items():
        before = first.get(pid)
        if before and before.io_bytes is not None and s.io_bytes is not None:
            moved += max(0, s.io_bytes - before.io_bytes)
    return moved


def starting_up(snap: Snapshot) -> list[int]:
    """Processes still importing, whose stacks moved between samples (a spawned worker loading torch):
    a slow start, not a hang. An import that does not move (an import-lock deadlock) is not listed."""
    if len(snap.samples) < 2:
        return []
    first, last = snap.samples[0], snap.samples[-1]
    out = []
    for pid, s in last.items():
        t, before = s.main_thread, first.get(pid)
        if t is None or before is None or before.main_thread is None:
            continue
        if any(f.file.startswith("<frozen importlib") for f in t.frames) and \
                [f.text() for f in t.frames] != [f.text() for f in before.main_thread.frames]:
            out.append(pid)
    return out


# -- the checks ---------------------------------------------------------------------------------------


def _collective(snap: Snapshot, trainers: list[ProcSample], workers: list[ProcSample],
                waits: dict[int, str] | None = None) -> Diagnosis | None:
    waits = waits or {}

    def op_of(p: ProcSample) -> str | None:
        return _collective_op(p.main_thread) or waits.get(_rank_number(p))  # type: ignore[arg-type]

    in_coll = [p for p in trainers if _in(p.main_thread, _COLLECTIVE_FILES) or _rank_number(p) in waits]
    if not in_coll:
        return None
    positions = []
    for p in trainers:
        t = p.main_thread
        fr = _innermost_user(t)
        op = op_of(p) if t else None
        positions.append(f"pid {p.pid}" + (f" ({_rank(p)})" if _rank(p) else "")
                         + (f" waits in {op}" if op else " is not in a collective")
                         + (f" at {_where(fr)}" if fr else ""))
    first = in_coll[0]
    fr = _innermost_user(first.main_thread)
    op = op_of(first)
    not_in = len(trainers) - len(in_coll)
    ops = {op_of(p) for p in in_coll}
    # a rank waiting inside backward is known from its flight recorder: watchdog/collectives.py judges
    # whether the collectives can still meet (DDP's next bucket may be the one the others wait in)
    by_flight = any(_rank_number(p) in waits for p in in_coll)
    # Proof only when every rank waits in a collective and they are not the same one: none of them can
    # go on. A rank outside any collective may be a straggler still computing its way there.
    unrecoverable = (f"the ranks wait in different collectives ({', '.join(sorted(o or '?' for o in ops))}): "
                     "none can complete") if not not_in and len(ops) > 1 and not by_flight else None
    detail = (f"{len(in_coll)} of {len(trainers)} process(es) wait in a collective ({op})"
              + (f"; {not_in} never reached it" if not_in else "")
              + ": " + "; ".join(positions))
    return Diagnosis("collective", _where(fr), detail, FIXES["collective"], _frames(first.main_thread),
                     first.pid, {"ranks": positions, "unrecoverable": unrecoverable})


def _dataloader(snap: Snapshot, trainers: list[ProcSample], workers: list[ProcSample]) -> Diagnosis | None:
    waiting = [p for p in trainers if _in_dataloader_next(p.main_thread)]
    if not waiting:
        return None
    main = waiting[0]
    busy_workers = [(w, _dataset_frame(w)) for w in workers]
    stuck = [(w, fr) for w, fr in busy_workers if fr is not None]
    loop = _innermost_user(main.main_thread)
    if not stuck:
        detail = (f"the training process waits for a batch at {_where(loop)}; "
                  + (f"{len(workers)} worker(s) alive, none inside the dataset" if workers
                     else "no DataLoader worker process is alive"))
        # With workers (the multi-process iterator) and none alive, no batch can ever come.
        dead = not workers and _in_worker_queue(main.main_thread)
        return Diagnosis("dataloader-worker", _where(loop), detail, FIXES["dataloader-worker"],
                         _frames(main.main_thread), main.pid,
                         {"unrecoverable": "the loop waits for a batch and no DataLoader worker is alive" if dead
                          else None})
    w, fr = stuck[0]
    index = sample_index(w)
    cpu = w.cpu_percent
    state = "spinning" if cpu is not None and cpu >= BUSY_CPU else "blocked"
    detail = (f"the training process waits for a batch at {_where(loop)}; DataLoader worker pid {w.pid} is "
              f"{state} in the dataset at {_where(fr)}"
              + (f", sample index {index}" if index is not None else "")
              + (f" ({len(stuck)} of {len(workers)} workers inside the dataset)" if len(workers) > 1 else ""))
    return Diagnosis("dataloader-worker", _where(fr), detail, FIXES["dataloader-worker"],
                     _frames(w.main_thread), w.pid,
                     {"worker_pid": w.pid, "sample_index": index, "loop_where": _where(loop),
                      "worker_wchan": w.wchan, "worker_cpu_percent": cpu,
                      "unrecoverable": _self_blocked(w, f"DataLoader worker pid {w.pid}") if state == "blocked"
                      else None})


def _busy(snap: Snapshot, trainers: list[ProcSample], workers: list[ProcSample]) -> Diagnosis | None:
    for p in trainers:
        cpus = [c for s in snap.samples if p.pid in s and (c := s[p.pid].cpu_percent) is not None]
        running = all(s[p.pid].status == "running" for s in snap.samples if p.pid in s)
        if not cpus or (sum(cpus) / len(cpus) < BUSY_CPU and not running):
            continue
        t = p.main_thread
        if t is None:  # not for a trainer: those have threads (see classify)
            continue
        if _wait_kind(t, p, gpu=bool(snap.gpu.get("gpus"))) not in (None, "sleep"):
            continue  # blocked in a lock, a file or a wait: the CPU is some other thread's
        computing = _computing(p, snap)
        if computing is not None:
            return computing
        fr = _loop_head(p, snap)
        seen = sorted({_where(f) or "?" for f in _busy_frames(p, snap)})
        detail = (f"pid {p.pid} burns {sum(cpus) / len(cpus):.0f}% CPU and makes no progress; in "
                  f"{len(seen)} distinct place(s) over {len(snap.samples)} samples: " + ", ".join(seen))
        return Diagnosis("busy-loop", _where(fr), detail, FIXES["busy-loop"], _frames(t), p.pid,
                         {"cpu_percent": cpus, "frames_seen": seen})
    return None


_TORCH_CODE = ("/torch/nn/", "/torch/_tensor.py", "/torch/functional.py", "/torch/autograd/", "/torch/_ops.py",
               "/torch/nn/functional.py", "/torch/_dynamo/", "/torch/_inductor/")


def _computing(p: ProcSample, snap: Snapshot) -> Diagnosis | None:
    """A process that burns CPU inside torch's own code (a module's forward, an autograd pass) called from
    the user's code, in at least half of the samples: a long computation (an evaluation, a pre-processing
    pass) that reports no progress, not a loop that spins. The stacks cannot tell a computation that
    will end from one that will not; the name must not claim a spin that the frames do not show."""
    hits, total, last = 0, 0, None
    for s in snap.samples:
        t = s[p.pid].main_thread if p.pid in s else None
        if t is None:
            continue
        total += 1
        user = _innermost_user(t)
        if user is None:
            continue
        below = t.frames[t.frames.index(user) + 1:]
        torch_fr = next((f for f in below if any(c in f.file for c in _TORCH_CODE)), None)
        if torch_fr is not None:
            hits += 1
            last = (user, torch_fr)
    if not total or last is None or 2 * hits < total:
        return None
    user, torch_fr = last
    short = torch_fr.file.split("/torch/", 1)[-1]
    detail = (f"pid {p.pid} burns CPU inside torch (torch/{short}, {torch_fr.function}) called from {_where(user)} "
              f"in {hits} of {total} samples: a long computation that reports no progress (an evaluation or a "
              "pre-processing pass outside any marked phase), not a loop that spins")
    return Diagnosis("computing", _where(user), detail, FIXES["computing"], _frames(p.main_thread), p.pid,
                     {"torch_samples": hits, "samples": total})


def _busy_frames(p: ProcSample, snap: Snapshot) -> list[Frame]:
    out = []
    for s in snap.samples:
        if p.pid in s:
            fr = _innermost_user(s[p.pid].main_thread)
            out.extend(([fr] if fr else []) + s[p.pid].burst)
    return out


def _loop_head(p: ProcSample, snap: Snapshot) -> Frame | None:
    """The first line of the loop a spinning thread moves around in: the smallest line seen in the function
    of the last sample's innermost user frame (a loop's test sits on its first line)."""
    last = _innermost_user(p.main_thread)
    if last is None:
        return None
    same = [f for f in _busy_frames(p, snap) if f.file == last.file and f.function == last.function]
    return min(same, key=lambda f: f.line, default=last)


def _blocked(snap: Snapshot, trainers: list[ProcSample], workers: list[ProcSample]) -> Diagnosis | None:
    for p in trainers:
        t = p.main_thread
        if t is None:
            continue
        kind = _wait_kind(t, p, gpu=bool(snap.gpu.get("gpus")))
        fr = _innermost_user(t)
        if kind is None:
            continue
        if kind == "lock":
            holders = [o for o in p.threads if o is not t and _wait_kind(o, p, gpu=False) == "lock"
                       and _innermost_user(o) is not None]
            if holders:
                other = holders[0]
                detail = (f"pid {p.pid}: the main thread waits for a lock at {_where(fr)} while thread "
                          f"{other.name or other.ident} waits for another at {_where(_innermost_user(other))}: "
                          "each holds what the other wants (lock order)")
                return Diagnosis("deadlock", _where(fr), detail, FIXES["deadlock"],
                                 _frames(t) + ["-- other thread --"] + _frames(other), p.pid,
                                 {"other_thread": _where(_innermost_user(other)),
                                  "unrecoverable": _cycle(p, t, detail)})
            detail = f"pid {p.pid}: the main thread waits for a lock at {_where(fr)} that no thread releases"
            return Diagnosis("deadlock", _where(fr), detail, FIXES["deadlock"], _frames(t), p.pid,
                             {"unrecoverable": _self_blocked(p, f"pid {p.pid}")})
        if kind == "wait":
            live = [o for o in p.threads if o is not t and _innermost_user(o) is not None]
            detail = (f"pid {p.pid}: the main thread waits on an event/condition/queue at {_where(fr)}; "
                      + ("no other thread of the process runs user code that could set it" if not live
                         else "other threads in user code: " + ", ".join(_where(_innermost_user(o)) or "?" for o in live)))
            return Diagnosis("deadlock", _where(fr), detail, FIXES["deadlock"], _frames(t), p.pid,
                             {"unrecoverable": _self_blocked(p, f"pid {p.pid}")})
        detail = {
            "device-sync": f"pid {p.pid} waits for the GPU at {_where(fr)}",
            "io": f"pid {p.pid} waits on a file at {_where(fr)} (state {p.status}, kernel wait {p.wchan})",
            "sleep": f"pid {p.pid} sleeps at {_where(fr)} and never gets past it",
        }[kind]
        return Diagnosis(kind, _where(fr), detail, FIXES[kind], _frames(t), p.pid)
    return None


def _cycle(p: ProcSample, t: ThreadStack, detail: str) -> str | None:
    """A lock cycle is proven when every thread of the process in user code waits for a lock: none of them
    can run on to release one (a thread that still runs might be about to)."""
    users = [o for o in p.threads if o is not t and _innermost_user(o) is not None]
    if all(_wait_kind(o, p, gpu=False) == "lock" for o in users):
        return "lock cycle: " + detail.split(": ", 1)[1]
    return None


def _self_blocked(p: ProcSample, who: str) -> str | None:
    """Proof that a process's main thread waits forever: it waits on a lock, event, condition or queue of its
    own process (threading, not multiprocessing: another process could feed that), and no other thread of
    the process runs user code that could release or set it."""
    t = p.main_thread
    if t is None:
        return None
    kind = _wait_kind(t, p, gpu=False)
    fr = _innermost_user(t)
    below = t.frames[t.frames.index(fr) + 1:] if fr in t.frames else t.frames
    if kind not in ("lock", "wait") or any("multiprocessing/" in f.file for f in below):
        return None
    if any("torch/autograd/" in f.file for f in below):
        return None  # inside backward: autograd's engine waits on its own threads, or DDP on the other ranks
    if any(o is not t and _innermost_user(o) is not None for o in p.threads):
        return None
    what = "a lock" if kind == "lock" else "an event, condition or queue"
    return (f"{who} waits on {what} of its own at {_where(fr)} and no other thread of it runs code that "
            "could release it")


# -- reading stacks -----------------------------------------------------------------------------------


def _wait_kind(t: ThreadStack, p: ProcSample, gpu: bool) -> str | None:
    """What the thread is blocked on: lock | wait | io | sleep | device-sync | None."""
    fr = _innermost_user(t)
    below = t.frames[t.frames.index(fr) + 1:] if fr in t.frames else t.frames
    files = [f.file for f in below]
    code = (fr.code or "") if fr else ""
    if any(f.endswith(_IO_FILES) for f in files):
        return "io"
    if gpu and waits_for_device(t):
        return "device-sync"
    if any(f.endswith("threading.py") or f.endswith("queue.py") or "multiprocessing/" in f for f in files):
        if below and below[-1].function == "acquire" and not any(f.function == "wait" for f in below):
            return "lock"
        if any(f.function in _WAIT_FUNCS for f in below):
            return "wait"
    if _LOCK_CODE.search(code):
        return "lock"
    if _SLEEP_CODE.search(code) or (p.wchan or "").endswith("nanosleep"):
        return "sleep"
    if _IO_CODE.search(code) or _IO_WCHAN.search(p.wchan or "") or p.status == "disk-sleep":
        return "io"
    if (p.wchan or "").startswith("futex"):
        return "wait"
    return None


def waits_for_device(t: ThreadStack | None) -> bool:
    """The thread waits for its GPU: inside torch.cuda (a synchronize, an event's or a stream's), on a line
    that reads a tensor back (`.item()`, `.cpu()`, `.tolist()`), or in the probe's last drain, which waits
    for its own device copies (contract.PROBE_DEVICE_WAIT)."""
    if t is None:
        return False
    fr = _innermost_user(t)
    below = t.frames[t.frames.index(fr) + 1:] if fr in t.frames else t.frames
    if any("torch/cuda" in f.file for f in below):
        return True
    if any(f.file.endswith(PROBE_DEVICE_WAIT[0]) and f.function == PROBE_DEVICE_WAIT[1] for f in below):
        return True
    return bool(fr is not None and _SYNC_CODE.search(fr.code or ""))


def _innermost_user(t: ThreadStack | None) -> Frame | None:
    if t is None:
        return None
    for f in reversed(t.frames):
        if is_user_frame(f.file):
            return f
    return None


def _in(t: ThreadStack | None, files: tuple[str, ...]) -> bool:
    return t is not None and any(f.file.endswith(files) for f in t.frames)


def _in_dataloader_next(t: ThreadStack | None) -> bool:
    return t is not None and any(f.file.endswith("torch/utils/data/dataloader.py") and f.function in _DATALOADER_NEXT
                           for f in t.frames)


def _in_worker_queue(t: ThreadStack | None) -> bool:
    """The loop waits on the queue of DataLoader worker processes (not a single-process loader)."""
    return t is not None and any(f.file.endswith("torch/utils/data/dataloader.py") and f.function in ("_get_data",
                                                                                              "_try_get_data")
                           for f in t.frames)


def _collective_op(t: ThreadStack | None) -> str | None:
    if not t:
        return None
    ops = [f.function for f in t.frames if f.file.endswith("torch/distributed/distributed_c10d.py")]
    return ops[0] if ops else None


def _dataset_frame(w: ProcSample) -> Frame | None:
    """The innermost user frame below the worker's fetch: the dataset (or collate) code it is in."""
    t = w.main_thread
    if t is None:
        return None
    below_fetch = False
    found = None
    for f in t.frames:
        if f.file.endswith("torch/utils/data/_utils/fetch.py"):
            below_fetch = True
        elif below_fetch and is_user_frame(f.file):
            found = f
    return found


_INDEX_NAMES = ("idx", "index", "i", "item", "key", "n")


def sample_index(w: ProcSample) -> str | None:
    t = w.main_thread
    for f in reversed(t.frames if t else []):
        if f.locals and is_user_frame(f.file):
            for name in _INDEX_NAMES:
                if name in f.locals:
                    return f.locals[name]
            args = [v for k, v in f.locals.items() if k != "self"]
            if args:
                return args[0]
    return None


def _waits_on_children(p: ProcSample) -> bool:
    """A launcher: its main thread only waits for child processes (torchrun, mp.spawn, a shell)."""
    t = p.main_thread
    if t is None:
        return False
    if any("torch/distributed/elastic/agent/" in f.file for f in t.frames):
        return True  # torchrun's agent: its loop sleeps between looks at its ranks
    return any(_CHILD_WAIT.search(f.file) and f.function in ("wait", "_wait", "join", "poll", "_try_wait")
               for f in t.frames[-6:])


def _rank_number(p: ProcSample) -> int | None:
    try:
        return int(p.rank) if p.rank is not None else None
    except ValueError:
        return None


def _rank(p: ProcSample) -> str | None:
    return f"rank {p.rank}" if p.rank is not None else None


def _where(f: Frame | None) -> str | None:
    return f"{f.file}:{f.line} ({f.function})" if f else None


def _frames(t: ThreadStack | None) -> list[str]:
    return [f.text() for f in (t.frames[-12:] if t else [])]


# -- fixes, one per cause -----------------------------------------------------------------------------

FIXES = {
    "dataloader-worker": (
        "A DataLoader worker is stuck in the frame shown; fix the dataset code there first. Meanwhile: "
        "`DataLoader(timeout=60)` turns a stuck worker into an error after 60 s (costs nothing while batches "
        "flow); `num_workers=0` removes the workers (loading runs on the training thread: slower, but no "
        "inter-process hang); `persistent_workers=False` restarts workers each epoch (seconds of start-up per "
        "epoch, drops state a worker leaked); `multiprocessing_context='spawn'` avoids inheriting locks, "
        "threads and device mappings through fork() (slower start, the dataset must be picklable) — seed "
        "003's ROCm hang after validation is of this kind."),
    "collective": (
        "The ranks disagree on the sequence of collectives: one waits in a collective another never calls "
        "(a rank-dependent branch, an early `continue`, uneven data so one rank runs an extra step). Make every "
        "rank call the same collectives in the same order; pass `timeout=timedelta(minutes=10)` to "
        "`init_process_group` so a mismatch fails instead of hanging; TORCH_DISTRIBUTED_DEBUG=DETAIL checks "
        "collective order; PyTorch's flight recorder (on by default, TORCH_FR_BUFFER_SIZE entries) records the "
        "last ones, DDP's gradient all-reduces included, and is what named the positions above where it was on."),
    "collective-straggler": (
        "One rank has not reached the collective the others wait in: it is still working (a slow backward, "
        "a long step on that rank alone) or stuck where its stack shows. If it arrives, the run goes on; "
        "if its stack stays in the same place, look there. A rank slower every step is a straggler "
        "(TG703): balance its data and any work done on that rank alone."),
    "deadlock": (
        "A thread waits for something no live thread will give: a lock held by a thread that waits for a "
        "lock this one holds (take locks in one global order everywhere), or an Event/Condition/queue that "
        "nothing will set (the thread meant to set it died or never started). Give waits a timeout "
        "(`lock.acquire(timeout=...)`, `event.wait(timeout)`) and fail loudly when it expires."),
    "busy-loop": (
        "The process spins in the loop shown without progress (seed 000: a component's initialisation "
        "polled a flag nothing set, at 4466% CPU). Make the loop wait on an event with a timeout instead of "
        "polling, give it an iteration or time limit, and check that whatever should end it can happen."),
    "computing": (
        "The process computes inside torch (a forward or backward pass) and reports no progress: a long "
        "evaluation or pre-processing pass. If it is expected, mark it (`with guard.phase(\"eval\"):`) so its "
        "time is learned per phase, or raise --stall-timeout; if it should not take this long, look at what it "
        "runs over (py-spy top, the frames shown)."),
    "device-sync": (
        "The host waits for the GPU (.item(), .cpu(), synchronize): a kernel that never finishes, a "
        "collective on the device, or a faulted GPU (check the GPU section and kernel log: Xid errors). "
        "CUDA_LAUNCH_BLOCKING=1 names the kernel; move host reads off the hot path."),
    "io": (
        "The process waits on a file: a network file system that stopped answering, a full or dead disk, a "
        "FIFO or pipe with no reader. Write checkpoints to local disk and copy them off asynchronously; "
        "write to a temporary name and rename; check the mount (`df`, `mount`, kernel hung-task lines)."),
    "sleep": (
        "The process sleeps in a loop waiting for something that never comes (a file, a flag, a port). Give "
        "the wait a deadline and fail with a message naming what it waited for."),
    "exit-barrier": (
        "This node's workers are done; its torchrun agent waits (up to 300 s, then fails) for the agents of "
        "the other nodes to reach the end too. Look at the other nodes: one that is still training is late, "
        "one whose agent died (killed, out of memory, its host gone) is lost and the wait ends in an error. "
        "Give every node the same number of steps (uneven data ends some nodes early)."),
    "stopped": (
        "Something stopped the process (a `kill -STOP`, Ctrl-Z in its terminal, a job scheduler's suspend, a "
        "debugger). `kill -CONT PID` resumes it where it was; find who stopped it (a shell job: `fg`)."),
    "unknown": (
        "trainguard could not name the cause. Read the stacks in the run folder (stacks/hang-*.txt); keep the "
        "automatic probe on (no --no-auto) so every Python process dumps its stacks on a signal, and run as a "
        "user with ptrace rights over the training process so py-spy can read the others and native frames."),
}
