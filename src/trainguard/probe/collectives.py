"""Where this rank is in the sequence of collectives: the n-th call per process group, and whether it is inside.

    collectives.install()            # the probe, once per process, after torch.distributed is importable
    collectives.position()           # {"group": "default", "op": "all_reduce", "seq": 1042, "inside": True, ...}
    collectives.changed()            # the position when it moved since the last call, else None (the flusher)

Why count at all: when a job hangs, every rank's stack says *which* collective it waits in, but not *which
one of them*: rank 3 in all_reduce and ranks 0-2 in all_reduce look alike whether they wait in the same
call or rank 3 is one call behind. A per-group counter on every rank makes the positions comparable:
"rank 3 waits in all_reduce #1042 while ranks 0-2 are in #1043" (watchdog/collectives.py reads them).

How: torch.distributed's collective functions are replaced, in `torch.distributed` and in
`distributed_c10d`, by thin wrappers that bump a counter and note the time before calling the original.
Only the outermost call counts (`all_gather_object` calls `all_gather` inside), so the count is the
number of collectives the user's code made, the same on every rank of a correct program. Point-to-point
calls (send/recv) are not counted: they pair two ranks, not the group. The counters live in plain Python
objects; the probe's background thread copies them to the store (`meta` key `collectives.<rank>`) a few
times a second, so the hot path writes nothing. A rank's answer to the watchdog's flight-recorder request
carries them too (probe/flightanswers.py), fresher than the copy when that thread is held behind a wedged GPU.

Known limits: collectives made from C++ (DDP's gradient buckets, FSDP's) are not counted (their waits show
in the stacks as the backward pass); a name imported before the probe was installed (`from
torch.distributed import all_reduce`) calls the original. PyTorch's flight recorder knows both (gloo and
NCCL, on by default): on a stall the probe reads it (probe/flightrec.py) and the watchdog prefers it;
these counters are what is left where it is off or missing (an older torch, TORCH_FR_BUFFER_SIZE=0).
"""

from __future__ import annotations

import functools
import inspect
import sys
import threading
import time
from types import FrameType
from typing import Any

from trainguard.contract import DEFAULT_GROUP
from trainguard.rules.crash import is_user_frame

COLLECTIVES = (
    "all_reduce", "broadcast", "barrier", "monitored_barrier", "all_gather", "all_gather_into_tensor",
    "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "reduce", "gather",
    "scatter", "all_gather_object", "broadcast_object_list", "gather_object", "scatter_object_list",
    "all_reduce_coalesced",
)

_lock = threading.Lock()
_state: dict[str, Any] = {"installed": False, "published": None}
_tls = threading.local()  # depth of nested calls on this thread: only the outermost counts
_counts: dict[str, int] = {}  # group -> collectives called so far
_ops: dict[str, dict[str, int]] = {}  # group -> op -> calls so far (which op a rank made fewer of)
_last: dict[str, Any] = {}  # the latest call: group, op, seq, inside, t, where (the line that called it)
USER_FRAME_DEPTH = 8  # frames looked through for the user's line that made a call


def install() -> bool:
    """Wrap torch.distributed's collectives in this process (idempotent). False when torch.distributed is
    not available; never raises (the guard must not become the failure)."""
    with _lock:
        if _state["installed"]:
            return True
        try:
            import torch.distributed as dist

            if not dist.is_available():
                return False
            from torch.distributed import distributed_c10d as c10d
        except Exception:
            return False
        for name in COLLECTIVES:
            original = getattr(c10d, name, None)
            if original is None or getattr(original, "__trainguard_counted__", False):
                continue
            wrapper = _wrap(name, original, _group_index(original))
            setattr(c10d, name, wrapper)
            if getattr(dist, name, None) is original:
                setattr(dist, name, wrapper)
        _state["installed"] = True
        return True


def position() -> dict[str, Any] | None:
    """This process's latest collective (None before the first): its group, op, number in the group,
    whether it is still inside, since when, and the calls per op of that group."""
    last = dict(_last)
    if not last:
        return None
    last["ops"] = dict(_ops.get(last["group"], {}))
    return last


def changed() -> dict[str, Any] | None:
    """The position when it moved since the previous call (for the flusher), else None."""
    last = _last.get("seq"), _last.get("group"), _last.get("inside")
    if last == _state["published"] or last[0] is None:
        return None
    _state["published"] = last
    return position()


def _wrap(name: str, original: Any, group_index: int | None) -> Any:
    @functools.wraps(original)
    def counted(*args: Any, **kwargs: Any) -> Any:
        if getattr(_tls, "depth", 0):
            return original(*args, **kwargs)
        try:
            group = kwargs.get("group", args[group_index] if group_index is not None and len(args) > group_index
                               else None)
            key = _group_name(group)
            seq = _counts.get(key, 0) + 1
            _counts[key] = seq
            ops = _ops.setdefault(key, {})
            ops[name] = ops.get(name, 0) + 1
            _last.update(group=key, op=name, seq=seq, inside=True, t=time.time(), where=_caller())
        except Exception:
            seq = None  # counting failed: call the collective all the same
        _tls.depth = 1
        try:
            return original(*args, **kwargs)
        finally:
            _tls.depth = 0
            if seq is not None and _last.get("seq") == seq:
                _last["inside"] = False

    counted.__trainguard_counted__ = True  # type: ignore[attr-defined]
    return counted


def _caller() -> str:
    """The line that made the call, as the watchdog writes places (`file:line (function)`): where a hang
    blames an extra call on one rank, it is the place to look (under NCCL the rank's stack has long moved
    on into its backward). The user's line where it is near (Lightning's or Accelerate's barrier sits a
    few frames below it), else the direct caller."""
    caller = sys._getframe(2)  # (0: here, 1: the wrapper)
    frame: FrameType | None = caller
    for _ in range(USER_FRAME_DEPTH):
        if frame is None:
            break
        if is_user_frame(frame.f_code.co_filename):
            caller = frame
            break
        frame = frame.f_back
    return f"{caller.f_code.co_filename}:{caller.f_lineno} ({caller.f_code.co_name})"


def _group_index(fn: Any) -> int | None:
    try:
        names = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return None
    return names.index("group") if "group" in names else None


def _group_name(group: Any) -> str:
    if group is None:
        return DEFAULT_GROUP
    try:
        from torch.distributed import distributed_c10d as c10d

        if group is c10d.GroupMember.WORLD:
            return DEFAULT_GROUP
        return str(getattr(group, "group_name", None) or id(group))
    except Exception:
        return str(id(group))
