"""What PyTorch's flight recorder knows about this rank's collectives, read when the watchdog asks.

    when = flightrec.asked(run_dir)    # the time of a request not answered yet, else None (one stat)
    flightrec.snapshot()               # {"groups": {...}, "active": [...], "kinds": {...}} or None

Why: the probe's counters (probe/collectives.py) see only the collectives the user's Python code calls.
DDP's gradient all-reduce is issued by its C++ Reducer inside `loss.backward()` (FSDP's all-gathers
likewise), so a rank waiting in it looks, to the counters and in its Python stack, like a rank still
computing its backward. PyTorch's flight recorders (on by default for gloo and NCCL: `TORCH_FR_BUFFER_SIZE`
entries, 2000 unless set, 0 turns them off) record every collective of every process group with its
sequence number in the group, whether it finished, and the Python stack that issued it. There are two:
the generic one (gloo) and NCCL's, dumped by a function of its own that only a CUDA build has; both are
read, and each entry says whether the device runs it (NCCL's). That matters: a NCCL collective returns
at once and runs on the GPU, so a rank's host goes on and waits for its device later (`.item()`, a
synchronize, `guard.finish()`), and what the device waits in is the oldest entry still in flight.

When: only on the watchdog's request, never on the hot path. The watchdog touches
`stacks/collectives.request` before it takes the stacks of a stall; the probe's background thread sees
the newer time (one stat per flush) and writes the answer to the store (`meta` key `flightrec.<rank>`).
Once the process is one rank of several, a thread of its own does that instead, every half second: the
background thread may be blocked in a device call behind a GPU a NCCL collective has wedged
(probe/flightanswers.py, `FlightResponder.start`). These threads run while the main thread waits in a collective
or for the device (gloo, NCCL and the device waits release the GIL there); once they have stopped, the
last drain's wait answers instead (probe/drain.py). Bounded: a few in-flight entries with their stacks
(each group's oldest and the newest), and the kinds of collective of the recorders' window without
stacks (a millisecond or two).
Fail-open: an older torch without the dump, a recorder switched off, anything unexpected gives None.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from trainguard.contract import COLLECTIVES_REQUEST, DEFAULT_GROUP
from trainguard.rules.crash import is_user_frame

MAX_ACTIVE = 8  # in-flight entries kept (a rank waits in one; DDP may have a few buckets out): see `_kept`

_answered = {"t": 0.0}  # the request time last answered, in this process
_request_paths: dict[str | os.PathLike, str] = {}  # run folder -> its request file, as a plain string


def asked(run_dir: str | os.PathLike) -> float | None:
    """The time of the watchdog's latest request when it is newer than the last one answered, else None."""
    path = _request_paths.get(run_dir)
    if path is None:
        # built once: a Path joined at every flush cost more of the background thread than the stat
        path = _request_paths[run_dir] = str(Path(run_dir) / "stacks" / COLLECTIVES_REQUEST)
    try:
        t = os.stat(path).st_mtime
    except OSError:
        return None
    if t <= _answered["t"]:
        return None
    _answered["t"] = t
    return t


def distributed() -> bool:
    """Whether this process is one rank of several: torch.distributed imported (never imported here) and
    its default group up with more than one rank. Fail-open: False."""
    dist = sys.modules.get("torch.distributed")
    try:
        return bool(dist is not None and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1)
    except Exception:
        return False


def answer(when: float, step: int | None = None) -> dict[str, Any]:
    """What goes into the store for the request made at `when`; `step`: the optimizer step the rank works on
    (the one after its last finished), so a wait inside backward can say whose backward it is."""
    snap = snapshot()
    return {"request": when, "t": time.time(), "step": step, **(snap if snap is not None else {"unavailable": True})}


def snapshot() -> dict[str, Any] | None:
    """This process's collectives as the flight recorders have them: per group the last sequence number
    enqueued and completed, the in-flight entries (group, seq, op, who issued it, the user's line, whether
    the device runs it), and the kinds of collective (op and sizes) each group made in the recorders'
    window. None without one."""
    try:
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            return None
        from torch._C import _distributed_c10d as c10d
    except Exception:
        return None
    world = _world_name()
    groups: dict[str, dict[str, int]] = {}
    entries: list[tuple[dict[str, Any], bool]] = []
    kinds: dict[str, dict[str, int]] = {}
    read = []
    for name, dump_name, json_name, device in RECORDERS:
        # private and absent from torch's stubs (NCCL's only in a CUDA build): a recorder that is not
        # there, or fails, is left out; the other may still answer
        dump, dump_json = getattr(c10d, dump_name, None), getattr(c10d, json_name, None)
        if dump is None or dump_json is None:
            continue
        try:
            _read(dump, dump_json, device, world, groups, entries, kinds)
        except Exception:
            continue  # the guard never becomes the failure: the counters and the stacks still answer
        read.append(name)
    if not groups and not entries:
        return None
    active = [_entry(e, device, world) for e, device in _kept(entries, world)]
    return {"groups": groups, "active": active, "kinds": kinds, "members": _members(world), "recorders": read}


# PyTorch keeps two flight recorders: the generic one (gloo, CPU collectives) and NCCL's (every collective
# of a NCCL process group; its dump exists only in a CUDA build). Both dump the same format.
RECORDERS = (("generic", "_dump_fr_trace", "_dump_fr_trace_json", False),
             ("nccl", "_dump_nccl_trace", "_dump_nccl_trace_json", True))


def _read(dump: Any, dump_json: Any, device: bool, world: str | None, groups: dict[str, dict[str, int]],
          entries: list[tuple[dict[str, Any], bool]], kinds: dict[str, dict[str, int]]) -> None:
    """One recorder's groups, in-flight entries and window, added to what the others gave."""
    import json
    import pickle

    active_dump = pickle.loads(_call(dump, includeCollectives=True, includeStackTraces=True, onlyActive=True))
    window = json.loads(_call(dump_json, includeCollectives=True, onlyActive=False))
    for pg, st in (active_dump.get("pg_status") or {}).items():
        mine = {"enqueued": int(st.get("last_enqueued_collective", -1)),
                "completed": int(st.get("last_completed_collective", -1))}
        seen = groups.setdefault(_name(str(pg), world), mine)
        for key in ("enqueued", "completed"):  # a group in both recorders: the further one
            seen[key] = max(seen[key], mine[key])
    entries.extend((e, device) for e in active_dump.get("entries") or []
                   if not e.get("is_p2p") and not e.get("retired"))
    for e in window.get("entries") or []:
        if e.get("is_p2p"):
            continue
        group = _group(e, world)
        kind = kind_of(_op(e.get("profiling_name")), e.get("input_sizes"))
        kinds.setdefault(group, {})
        kinds[group][kind] = kinds[group].get(kind, 0) + 1


def _call(fn: Any, **flags: bool) -> Any:
    """A dump with its flags by name, or in that order where a build names them otherwise."""
    try:
        return fn(**flags)
    except TypeError:
        return fn(*flags.values())


def _kept(entries: list[tuple[dict[str, Any], bool]], world: str | None) -> list[tuple[dict[str, Any], bool]]:
    """At most MAX_ACTIVE in-flight entries, newest first: each group's oldest, where a device that runs
    collectives in order is stuck (a NCCL rank's host runs on and may have dozens queued behind it), and
    the newest, where a host blocked in a call waits."""
    by_age = sorted(entries, key=lambda ed: (ed[0].get("time_created_ns") or 0, ed[0].get("collective_seq_id", 0)))
    oldest: dict[str, int] = {}
    for i, (e, _) in enumerate(by_age):
        oldest.setdefault(_group(e, world), i)
    keep = set(list(oldest.values())[:MAX_ACTIVE])
    for i in range(len(by_age) - 1, -1, -1):
        if len(keep) >= MAX_ACTIVE:
            break
        keep.add(i)
    return [by_age[i] for i in sorted(keep, reverse=True)]


def _entry(e: dict[str, Any], device: bool, world: str | None) -> dict[str, Any]:
    frames = e.get("frames") or []
    return {"group": _group(e, world), "seq": int(e.get("collective_seq_id", -1)), "op": _op(e.get("profiling_name")),
            "sizes": e.get("input_sizes"), "from": origin(frames), "where": _user_where(frames),
            "t": (e.get("time_created_ns") or 0) / 1e9, "device": device, "state": e.get("state")}


def _group(e: dict[str, Any], world: str | None) -> str:
    return _name(str((e.get("process_group") or ("?",))[0]), world)


def kind_of(op: str, sizes: Any) -> str:
    """A collective's kind for comparing ranks: its op and tensor sizes (`all_reduce [161]`)."""
    try:
        shown = ",".join("x".join(str(n) for n in s) for s in sizes or [])
    except TypeError:
        shown = ""
    return f"{op} [{shown}]"


def origin(frames: list[dict[str, Any]]) -> str:
    """Who issued a collective, from the Python stack the recorder kept: `python` (a torch.distributed
    call), `backward` (inside autograd: DDP's Reducer all-reducing gradient buckets), else `other`."""
    files = [str(f.get("filename") or "") for f in frames]
    if any(f.endswith("torch/distributed/distributed_c10d.py") for f in files):
        return "python"
    if any("torch/autograd/" in f for f in files):
        return "backward"
    return "other"


def _user_where(frames: list[dict[str, Any]]) -> str | None:
    for f in frames:  # innermost first
        name = str(f.get("filename") or "")
        if is_user_frame(name):
            return f"{name}:{f.get('line')} ({f.get('name')})"
    return None


def _op(profiling_name: Any) -> str:
    """`gloo:all_reduce` / `nccl:all_reduce` -> `all_reduce`."""
    return str(profiling_name or "?").split(":", 1)[-1]


def _members(world: str | None) -> dict[str, list[int]]:
    """The global ranks of each process group this process knows (a group a rank never used shows in no
    recorder status, so the watchdog needs to know who belongs to it)."""
    try:
        from torch.distributed import distributed_c10d as c10d

        return {_name(str(name), world): [int(r) for r in c10d.get_process_group_ranks(pg)]
                for pg, name in list(c10d._world.pg_names.items())}
    except Exception:
        return {}


def _world_name() -> str | None:
    try:
        from torch.distributed import distributed_c10d as c10d

        return str(c10d._get_default_group().group_name)
    except Exception:
        return None


def _name(pg: str, world: str | None) -> str:
    return DEFAULT_GROUP if pg == world else pg
