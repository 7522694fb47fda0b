"""What the probe can read of the plan from the live objects at `trainguard.watch`: the scheduler's
horizon and the model's output size. Read once, at start-up; every lookup is best effort.
"""

from __future__ import annotations

import functools
from typing import Any

# Names under which a LambdaLR's function (or a Hugging Face schedule's partial) holds its length.
_HORIZON_NAMES = ("num_training_steps", "total_steps", "num_steps", "max_steps", "total_iters", "T_max")


# Schedulers that cycle on purpose: an LR that returns to its floor again and again is their design.
CYCLIC = ("CosineAnnealingWarmRestarts", "CyclicLR")


def children(scheduler: Any) -> list[Any]:
    """The schedulers a composite runs (`SequentialLR`, `ChainedScheduler`), else []."""
    return list(getattr(scheduler, "_schedulers", None) or [])


def sched_names(scheduler: Any) -> list[str]:
    """Type names of the scheduler and, for a composite, of every scheduler inside it."""
    if scheduler is None:
        return []
    out = [type(scheduler).__name__]
    for child in children(scheduler):
        out += sched_names(child)
    return out


def is_timm(scheduler: Any) -> bool:
    """timm's scheduler family: stepped with `step(epoch)` / `step_update(num_updates)`, not torch's `step()`."""
    return hasattr(scheduler, "step_update") and hasattr(scheduler, "_get_lr") and hasattr(scheduler, "t_initial")


def sched_epoch(scheduler: Any) -> int | None:
    """How many times the scheduler has been stepped (`last_epoch`). A `ChainedScheduler` keeps no count
    of its own: its first scheduler's, which it steps every time, is the count. Hot path: attribute reads."""
    epoch = getattr(scheduler, "last_epoch", None)
    if epoch is None:
        kids = getattr(scheduler, "_schedulers", None)
        if kids:
            epoch = getattr(kids[0], "last_epoch", None)
    return epoch if isinstance(epoch, int) else None


def sched_horizon(scheduler: Any) -> int | None:
    """The schedule's length in scheduler steps, when the scheduler says it; None otherwise.

    Only schedules that decay to their end count: a `LinearLR` warming *up* ends its ramp at
    `total_iters` and then holds the LR, so its `total_iters` is not the run's horizon. A `SequentialLR`
    ends where its last scheduler ends (its last milestone plus that scheduler's horizon); a
    `ChainedScheduler` where the longest of its decaying schedulers ends. timm's schedulers (stepped per
    update, `t_in_epochs=False`) end at `t_initial` × `cycle_limit`.
    """
    if scheduler is None:
        return None
    name = type(scheduler).__name__
    if name == "OneCycleLR":
        return _int(getattr(scheduler, "total_steps", None))
    if name == "CosineAnnealingLR":
        return _int(getattr(scheduler, "T_max", None))
    if name == "PolynomialLR":
        return _int(getattr(scheduler, "total_iters", None))
    if name == "LinearLR":
        if getattr(scheduler, "end_factor", 1.0) < getattr(scheduler, "start_factor", 1.0):
            return _int(getattr(scheduler, "total_iters", None))
        return None
    if name in ("LambdaLR", "MultiplicativeLR"):
        for fn in getattr(scheduler, "lr_lambdas", [])[:1]:
            return _from_function(fn)
        return None
    if name == "SequentialLR":
        kids, milestones = children(scheduler), list(getattr(scheduler, "_milestones", None) or [])
        if not kids or len(milestones) != len(kids) - 1:
            return None
        last = sched_horizon(kids[-1])
        return _int(milestones[-1] + last) if last and milestones else last
    if name == "ChainedScheduler":
        horizons = [h for h in (sched_horizon(k) for k in children(scheduler)) if h]
        return max(horizons) if horizons else None
    if is_timm(scheduler):
        if getattr(scheduler, "t_in_epochs", True) or getattr(scheduler, "cycle_mul", 1.0) != 1.0:
            return None  # counted in epochs, or cycles of growing length: not a step count we can compare
        return _int(scheduler.t_initial * max(1, int(getattr(scheduler, "cycle_limit", 1) or 1)))
    return None


_WARMUP_NAMES = ("num_warmup_steps", "warmup_steps", "warmup_iters", "warmup")


def sched_warmup(scheduler: Any) -> int | None:
    """The warmup's length in scheduler steps, when the scheduler says it; None otherwise (or no warmup).

    `OneCycleLR` rises for `pct_start` of its steps; a rising `LinearLR` for `total_iters`; a Hugging Face
    style `LambdaLR` for its `num_warmup_steps`; a `SequentialLR` whose first scheduler warms up until
    its first milestone; timm's for `warmup_t`. TG102 says whether a schedule longer than the run cuts
    its warmup short or only its decay.
    """
    if scheduler is None:
        return None
    name = type(scheduler).__name__
    if name == "OneCycleLR":
        total, pct = getattr(scheduler, "total_steps", None), getattr(scheduler, "_schedule_phases", None)
        return _int(pct[0]["end_step"] + 1) if pct else _int(total and total * 0.3)
    if name == "LinearLR":
        if getattr(scheduler, "end_factor", 1.0) > getattr(scheduler, "start_factor", 1.0):
            return _int(getattr(scheduler, "total_iters", None))
        return None
    if name in ("LambdaLR", "MultiplicativeLR"):
        for fn in getattr(scheduler, "lr_lambdas", [])[:1]:
            return _named_value(fn, _WARMUP_NAMES)
        return None
    if name == "SequentialLR":
        kids, milestones = children(scheduler), list(getattr(scheduler, "_milestones", None) or [])
        if kids and milestones and sched_warmup(kids[0]) is not None:
            return _int(milestones[0])
        return None
    if name == "ChainedScheduler":
        warmups = [w for w in (sched_warmup(k) for k in children(scheduler)) if w]
        return max(warmups) if warmups else None
    if is_timm(scheduler) and not getattr(scheduler, "t_in_epochs", True):
        return _int(getattr(scheduler, "warmup_t", None)) or None
    return None


def _named_value(fn: Any, names: tuple[str, ...]) -> int | None:
    """An integer a schedule function was given under one of `names` (a partial's keyword or a closure cell)."""
    if isinstance(fn, functools.partial):
        for key in names:
            if key in fn.keywords:
                return _int(fn.keywords[key])
        fn = fn.func
    code, cells = getattr(fn, "__code__", None), getattr(fn, "__closure__", None)
    if code is None or not cells:
        return None
    free = dict(zip(code.co_freevars, cells))
    for key in names:
        if key in free:
            try:
                return _int(free[key].cell_contents)
            except ValueError:  # an empty cell
                return None
    return None


def _from_function(fn: Any) -> int | None:
    if isinstance(fn, functools.partial):
        for key in _HORIZON_NAMES:
            if key in fn.keywords:
                return _int(fn.keywords[key])
        fn = fn.func
    code = getattr(fn, "__code__", None)
    cells = getattr(fn, "__closure__", None)
    if code is None or not cells:
        return None
    free = dict(zip(code.co_freevars, cells))
    for key in (*_HORIZON_NAMES, "total"):
        if key in free:
            try:
                return _int(free[key].cell_contents)
            except ValueError:  # an empty cell
                return None
    return None


def output_size(model: Any, config: dict | None) -> int | None:
    """Classes or vocabulary: from the config when it says, else the output Linear's out_features."""
    for key in ("vocab_size", "num_classes", "num_labels", "n_classes", "vocab"):
        value = (config or {}).get(key)
        if isinstance(value, int) and value >= 2:
            return value
    if model is None or not hasattr(model, "modules"):
        return None
    # The last module with weights of its own, in registration order, is taken as the output layer;
    # only a Linear there says "classes or vocabulary" (a detector's last Conv2d says nothing).
    first = last = None
    for module in model.modules():
        if next(iter(module.children()), None) is None and next(module.parameters(recurse=False), None) is not None:
            first = first or module
            last = module
    if last is None or type(last).__name__ != "Linear":
        return None
    size = _int(getattr(last, "out_features", None))
    if size is not None and first is not None and type(first).__name__ == "Linear" and first is not last and first.in_features == size:
        return None  # the output reconstructs the input (an autoencoder, a VAE): its size is not a class count
    return size


def _int(value: Any) -> int | None:
    try:
        v = int(value)
    except (TypeError, ValueError):
        return None
    return v if v > 0 else None
