"""Getting numbers off the device without making the training thread wait for them.

The training thread keeps detached references to what the loop gives (`guard.step`) and, once per
optimizer step, as the step is emitted: on the CPU, reads the numbers (`resolve`: nothing to wait for); on a
GPU, reads their version counters only (`versions`). The background thread stacks each GPU step's scalars
into one small device vector on the stream they were made on (`stage_step`: one launch, after everything
that made them), reads the counters again (a value changed in place since is dropped, never read wrong),
copies the vectors of several steps at once into pinned host memory (`copy_staged`: one concatenation, one
non-blocking copy, one event, on that same stream), later asks the event whether the copy is done
(`query()` never blocks) and only then reads the values. So the hot path never synchronises host and
device; this is the whole trick, and why a per-step `loss.item()` (7.7% on an H200 GPT-2-sized step) is
never called here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any


@dataclass
class DevicePack:
    """Named scalars of one step, on their way from the device to the host."""

    names: list[str]
    host: Any  # torch.Tensor: pinned host memory on CUDA, the tensor itself elsewhere
    event: Any  # torch.cuda.Event or None

    def ready(self) -> bool:
        return self.event is None or self.event.query()

    def pairs(self) -> list[tuple[str, float]]:
        """(name, value) in packing order; a name repeats when several micro-batches reported it."""
        # Off the training thread. On CUDA the event has completed, so this reads finished host memory;
        # on other devices it may wait for the device, but only this background thread waits.
        if isinstance(self.host, list):  # CPU tensors, unstacked: each is read where it is
            return [(n, float(t)) for n, t in zip(self.names, self.host)]
        return list(zip(self.names, self.host.tolist()))


def elapsed(start: Any, end: Any) -> float | None:
    """Seconds of device time from CUDA event `start` to `end` once both have completed, else None (asking
    never waits: `query()` first; an event of another device or never recorded is None too)."""
    try:
        if not end.query():
            return None
        seconds = start.elapsed_time(end) / 1000.0
    except Exception:
        return None
    return seconds if seconds >= 0 else None


def is_tensor(value: Any) -> bool:
    return type(value).__module__.startswith("torch") and hasattr(value, "detach")


def resolve(pending: Any, weights: Any = None, weights_fresh: bool = False, extra: Any = ()
            ) -> tuple[list[tuple[str, Any]], dict[str, list[float]]]:
    """The values a step's calls gave, as named host numbers and named 0-d float32 tensors (detached).

    `pending` holds (name, value) pairs, or (prefix, {key: value}) for a dict of parts or logged values;
    `weights` the last weights given (their numbers always, their tensors only when given during this
    step, `weights_fresh`); `extra` more (name, tensor) pairs (the optimizer's). A name repeats when
    several micro-batches gave it. A 0-d CPU tensor is read here (nothing to wait for): once per optimizer
    step on the training thread in a CPU run, so the loop is written out (a dozen values, no call each)."""
    named: list[tuple[str, Any]] = []
    floats: dict[str, list[float]] = {}
    kinds = _KINDS
    for prefix, value in pending:
        for key, v in (value.items() if type(value) is dict else ((None, value),)):
            kind = kinds.get(type(v))
            if kind is None:
                kind = kinds[type(v)] = is_tensor(v)
            name = prefix if key is None else prefix + key
            if not kind:
                number = float(v)
            elif v.is_cpu and v.dim() == 0:
                number = v.item()  # a CPU number: read where it is (no detach: item reads it)
            else:
                named.append((name, as_scalar(v)))
                continue
            got = floats.get(name)
            if got is None:
                floats[name] = [number]
            else:
                got.append(number)
    for name, v in _weight_tensors(weights, weights_fresh, floats):
        _read(name, v, named, floats)
    for name, v in extra:
        _read(name, v, named, floats)
    return named, floats


def _weight_tensors(weights: Any, fresh: bool, floats: dict[str, list[float]]) -> list[tuple[str, Any]]:
    """A step's weights: the numbers go into `floats` (one each: the last call's weights are the step's);
    the tensors are returned, named, when given during this step (`fresh`)."""
    tensors: list[tuple[str, Any]] = []
    for key, v in (weights or {}).items():
        if not _kind(v):
            floats["weight:" + key] = [float(v)]
        elif fresh:
            tensors.append(("weight:" + key, v))
    return tensors


def _kind(v: Any) -> bool:
    """Whether `v` is a tensor, asked once per type."""
    kind = _KINDS.get(type(v))
    if kind is None:
        kind = _KINDS[type(v)] = is_tensor(v)
    return kind


def _read(name: str, v: Any, named: list[tuple[str, Any]], floats: dict[str, list[float]]) -> None:
    """One value of `resolve` outside its loop (weights, the optimizer's tensors: a few a step)."""
    if not _kind(v):
        floats.setdefault(name, []).append(float(v))
    elif v.is_cpu and v.dim() == 0:
        floats.setdefault(name, []).append(v.item())
    else:
        named.append((name, as_scalar(v)))


_KINDS: dict[type, bool] = {}  # type -> is it a tensor (asked once per type)


def snapshot_scalar(tensor: Any) -> Any:
    """`as_scalar` of state the loop keeps and rewrites in place (a GradScaler's scale, a tensor learning
    rate): a copy, since the value is read later, off the training thread, after update() or the
    scheduler has changed it (a row once said 32768 for a step taken at 65536). One small launch."""
    t = as_scalar(tensor)
    return t.clone()


def as_scalar(tensor: Any) -> Any:
    """A 0-d float32 view or reduction of `tensor`, detached; launches at most a kernel or two."""
    t = tensor.detach()
    if t.dim() == 0 and t.dtype == _float32():
        return t  # the common case, a float32 scalar loss: nothing to launch
    if t.numel() != 1:
        t = t.float().mean()
    else:
        t = t.reshape(())
    if t.dtype != _float32():
        t = t.float()
    return t


_F32 = None


def _float32() -> Any:
    global _F32
    if _F32 is None:
        import torch

        _F32 = torch.float32
    return _F32


def pack(named: list[tuple[str, Any]]) -> list[DevicePack]:
    """Stack named 0-d tensors (grouped by device) and start moving them to the host."""
    import torch

    groups: dict[Any, list[tuple[str, Any]]] = {}
    for name, tensor in named:
        groups.setdefault(tensor.device, []).append((name, tensor))
    packs = []
    for device, items in groups.items():
        if device.type == "cpu":
            # On the CPU there is no copy to make and nothing to wait for: keep the scalars as they are
            # (the background thread reads them), which saves the stack's allocation and kernel.
            packs.append(DevicePack([n for n, _ in items], [t for _, t in items], None))
            continue
        vec = torch.stack([t for _, t in items])
        if device.type == "cuda":
            host, event = copy_to_host(vec)
            packs.append(DevicePack([n for n, _ in items], host, event))
        else:
            packs.append(DevicePack([n for n, _ in items], vec, None))
    return packs


@dataclass
class Staged:
    """Named scalars of one step stacked on a GPU (training thread), waiting for the background thread's copy."""

    names: list[str]
    vec: Any  # a 1-d float32 device tensor
    stream: Any  # the training thread's stream when it was stacked (the copy goes on it)


def stage(named: list[tuple[str, Any]]) -> list[Any]:
    """Training thread, once per step: the step's 0-d tensors stacked per device (one launch each). CPU
    tensors are kept as they are (a DevicePack with nothing to wait for), read by the background thread."""
    import torch

    groups: dict[Any, list[tuple[str, Any]]] = {}
    for name, tensor in named:
        groups.setdefault(tensor.device, []).append((name, tensor))
    out: list[Any] = []
    for device, items in groups.items():
        names = [n for n, _ in items]
        if device.type == "cpu":
            out.append(DevicePack(names, [t for _, t in items], None))
        elif device.type == "cuda":
            out.append(Staged(names, torch.stack([t for _, t in items]), current_stream(device.index)))
        else:
            out.append(DevicePack(names, torch.stack([t for _, t in items]), None))
    return out


def stage_step(pending: Any, weights: Any, weights_fresh: bool, extra: Any) -> tuple[list[Any], dict[str, list[float]]]:
    """Training thread, once per optimizer step on a GPU: `resolve` and `stage` in one pass, for the common
    case of 0-d device tensors (the loss, its parts, the optimizer's statistics): one stack of the
    tensors, no per-value check. Anything else (a CPU tensor, a vector of per-sample losses) takes the
    general path. (A CPU run reads each value where it is, `resolve`: cheaper than a stack of a dozen
    scalars.)"""
    import torch

    names: list[str] = []
    tensors: list[Any] = []
    floats: dict[str, list[float]] = {}
    kinds = _KINDS
    for name, value in pending:
        for key, v in (value.items() if type(value) is dict else ((None, value),)):
            kind = kinds.get(type(v))
            if kind is None:
                kind = kinds[type(v)] = is_tensor(v)
            if kind:
                names.append(name if key is None else name + key)
                tensors.append(v)
            else:
                floats.setdefault(name if key is None else name + key, []).append(float(v))
    for name, t in (*_weight_tensors(weights, weights_fresh, floats), *extra):
        names.append(name)
        tensors.append(t)
    if not tensors:
        return [], floats
    vec = None
    try:
        # (no `torch.no_grad()`: its context costs as much as the stack, and the values come detached; one
        # that does not, a logged value with its graph, makes a vector that is detached at once)
        vec = torch.stack(tensors)
        if vec.requires_grad:
            vec = vec.detach()
    except (RuntimeError, TypeError):  # mixed devices or shapes: the general path below
        pass
    if vec is not None and vec.dim() == 1 and vec.is_cuda:
        if vec.dtype != torch.float32:
            vec = vec.float()
        return [Staged(names, vec, current_stream(vec.get_device()))], floats
    named, more = resolve((), extra=list(zip(names, tensors)))
    for name, vs in more.items():
        floats.setdefault(name, []).extend(vs)
    return stage(named) if named else [], floats


DEFERRED: Any = object()  # a GPU step's values, unstacked: the background thread stacks them (probe/drain.py)


def versions(pending: Any, weights: Any, weights_fresh: bool, dims: bool = True) -> list[int | None] | None:
    """The version counter of each tensor among a step's values (None for a number), in order: one that
    moved was changed in place (`add_`, `zero_`, `copy_`) after it was given. ~0.1 us a tensor.

    None when the step's values are to be stacked at once: one without a version counter (made under
    `torch.inference_mode()`), or, when `dims`, a tensor of more than one element (a vector of per-sample
    losses, reduced at once rather than held whole)."""
    out: list[int | None] = []
    add = out.append
    kinds = _KINDS
    try:
        for _, value in pending:
            for v in (value.values() if type(value) is dict else (value,)):
                kind = kinds.get(type(v))
                if kind is None:
                    kind = kinds[type(v)] = is_tensor(v)
                if not kind:
                    add(None)
                elif dims and v.ndim:
                    return None
                else:
                    add(v._version)
        if weights and weights_fresh:
            for v in weights.values():
                if not _kind(v):
                    add(None)
                elif dims and v.ndim:
                    return None
                else:
                    add(v._version)
    except RuntimeError:  # "Inference tensors do not track version counter"
        return None
    return out


def is_device_error(exc: BaseException) -> bool:
    """A sticky device error (a device-side assert, an illegal access): every later call on the device fails."""
    text = f"{type(exc).__name__}: {exc}"
    return "AcceleratorError" in text or "CUDA error" in text or "device-side assert" in text


@contextlib.contextmanager
def on_stream(key: Any) -> Iterator[None]:
    """Work of the background thread on a training thread's stream (`current_stream`'s tuple) and its device:
    what it launches there runs after what the training thread launched before."""
    import torch

    stream_id, device_index, device_type = key
    stream = torch.cuda.Stream(stream_id=stream_id, device_index=device_index, device_type=device_type)
    with torch.cuda.device(device_index), torch.cuda.stream(stream):
        yield


def current_stream(index: int | None) -> Any:
    """The calling thread's current CUDA stream on device `index`, as a cheap tuple (~0.5 us)."""
    import torch

    get = getattr(torch._C, "_cuda_getCurrentStream", None)
    if get is not None:
        return get(torch.cuda.current_device() if index is None else index)
    s = torch.cuda.current_stream(index)
    return (s.stream_id, s.device_index, s.device_type)


def copy_staged(staged: list[Staged]) -> list[DevicePack]:
    """Background thread: several steps' staged vectors copied to the host at once, per device and stream
    (one concatenation, one non-blocking copy into pinned memory, one event); one DevicePack per Staged,
    in order, sharing the group's host buffer and event."""
    import torch

    groups: dict[Any, list[int]] = {}
    for i, st in enumerate(staged):
        groups.setdefault(st.stream, []).append(i)
    out: list[Any] = [None] * len(staged)
    for key, idx in groups.items():
        with on_stream(key):
            vecs = [staged[i].vec for i in idx]
            flat = torch.cat(vecs) if len(vecs) > 1 else vecs[0]
            host = torch.empty(flat.shape, dtype=flat.dtype, pin_memory=True)
            host.copy_(flat, non_blocking=True)
            event = torch.cuda.Event()
            event.record()
        at = 0
        for i in idx:
            n = len(staged[i].names)
            out[i] = DevicePack(staged[i].names, host[at: at + n], event)
            at += n
    return out


def copy_to_host(tensor: Any) -> tuple[Any, Any]:
    """Start a non-blocking copy of a CUDA tensor into pinned host memory; returns (host, event).

    The copy and the event go on the stream of the tensor's own device, not the thread's current device:
    a model on cuda:1 without `set_device(1)` would otherwise get an event that completes before its copy.
    """
    import torch

    with torch.cuda.device(tensor.device):
        host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
        host.copy_(tensor, non_blocking=True)
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(tensor.device))
    return host, event
