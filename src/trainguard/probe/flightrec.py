"""What PyTorch's flight recorder knows about this rank's collectives, read when the watchdog asks.

    when = flightrec.asked(run_dir)    # the time of a request not answered yet, else None (one stat)
    flightrec.snapshot()               # {"groups": {...}, "active": [...], "kinds": {...}} or None

Why: the probe's counters (probe/collectives.py) see only the collectives the user's Python code calls.
DDP's gradient all-reduce is issued by its C++ Reducer inside `loss.backward()` (FSDP's all-gathers
likewise), so a rank waiting in it looks, to the counters and in its Python stack, like a rank still
computing its backward. PyTorch's flight recorder (on by default for gloo and NCCL: `TORCH_FR_BUFFER_SIZE`
entries, 2000 unless set, 0 turns it off) records every collective of every process group with its
sequence number in the group, whether it finished, and the Python stack that issued it.

When: only on the watchdog's request, never on the hot path. The watchdog touches
`stacks/collectives.request` before it takes the stacks of a stall; the probe's background thread sees
the newer time (one stat per flush) and writes the answer to the store (`meta` key `flightrec.<rank>`).
That thread runs while the main thread waits in a collective (gloo and NCCL release the GIL there).
Bounded: the in-flight entries (a handful) with their stacks, and the kinds of collective of the
recorder's window without stacks (a millisecond or two). Fail-open: an older torch without the dump, a
recorder switched off, anything unexpected gives None.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from trainguard.contract import COLLECTIVES_REQUEST
from trainguard.rules.crash import is_user_frame

MAX_ACTIVE = 8  # in-flight entries kept, newest first (a rank waits in one; DDP may have a few buckets out)
DEFAULT_GROUP = "default"  # as probe/collectives.py names the world group

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


def answer(when: float, step: int | None = None) -> dict[str, Any]:
    """What goes into the store for the request made at `when`; `step`: the optimizer step the rank works on
    (the one after its last finished), so a wait inside backward can say whose backward it is."""
    snap = snapshot()
    return {"request": when, "t": time.time(), "step": step, **(snap if snap is not None else {"unavailable": True})}


def snapshot() -> dict[str, Any] | None:
    """This process's collectives as the flight recorder has them: per group the last sequence number
    enqueued and completed, the in-flight entries (group, seq, op, who issued it, the user's line), and
    the kinds of collective (op and sizes) each group made in the recorder's window. None without one."""
    try:
        import json
        import pickle

        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            return None
        from torch._C import _distributed_c10d as c10d

        # private and absent from torch's stubs; a torch without them raises here: "unavailable"
        dump = c10d._dump_fr_trace  # type: ignore[attr-defined]
        dump_json = c10d._dump_fr_trace_json  # type: ignore[attr-defined]
        active_dump = pickle.loads(dump(includeCollectives=True, includeStackTraces=True, onlyActive=True))
        window = json.loads(dump_json(includeCollectives=True, onlyActive=False))
        world = _world_name()
        groups = {}
        for pg, st in (active_dump.get("pg_status") or {}).items():
            groups[_name(str(pg), world)] = {"enqueued": int(st.get("last_enqueued_collective", -1)),
                                             "completed": int(st.get("last_completed_collective", -1))}
        active: list[dict[str, Any]] = []
        for e in reversed(active_dump.get("entries") or []):
            if e.get("is_p2p") or e.get("retired") or len(active) >= MAX_ACTIVE:
                continue
            frames = e.get("frames") or []
            active.append({"group": _name(str((e.get("process_group") or ("?",))[0]), world),
                           "seq": int(e.get("collective_seq_id", -1)), "op": _op(e.get("profiling_name")),
                           "sizes": e.get("input_sizes"), "from": origin(frames), "where": _user_where(frames),
                           "t": (e.get("time_created_ns") or 0) / 1e9})
        kinds: dict[str, dict[str, int]] = {}
        for e in window.get("entries") or []:
            if e.get("is_p2p"):
                continue
            group = _name(str((e.get("process_group") or ("?",))[0]), world)
            kind = kind_of(_op(e.get("profiling_name")), e.get("input_sizes"))
            kinds.setdefault(group, {})
            kinds[group][kind] = kinds[group].get(kind, 0) + 1
    except Exception:
        return None  # the guard never becomes the failure: the counters and the stacks still answer
    if not groups and not active:
        return None
    return {"groups": groups, "active": active, "kinds": kinds, "members": _members(world)}


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
