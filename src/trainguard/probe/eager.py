"""Hooks that `torch.compile` must not trace: the probe's optimizer hooks run eagerly, always.

A compiled `optimizer.step` traces its step hooks with it. Traced, the probe's bookkeeping (a clock
read, counters on Python objects, SQLite queues) either becomes a constant of the graph or breaks it
midway, and a resumed half-graph replayed without its guards (`torch.compiler.skip_all_guards_unsafe`,
which users set to save the guards' cost) fails inside the hook on every step. Under compilation the hook
is called through `torch.compiler.disable`: a graph break at the hook's call, nothing traced inside it.
Eagerly it is called directly: the disabled wrapper costs ~8 us a call even when nothing compiles.

"Under compilation" is two cases: dynamo tracing the hook (`torch.compiler.is_compiling()`), and the
compiled function running after a graph break, where dynamo's frame callback is still set and would
compile each Python frame the hook enters (is_compiling() is False then: nothing is being traced yet).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def compile_checks() -> tuple[Callable[[], bool], Callable[[], Any]] | None:
    """torch's two tests, asked as `tracing() or callback() is not None` (~0.1 us, written out in the
    hooks that run at every step rather than called through a function of their own): is dynamo tracing
    the caller, and dynamo's frame callback (set while a compiled function runs). None where torch has no
    compiler. Without the callback's getter (private, so it may go) the callback never answers None:
    every call is taken as compiled, slower, never wrong."""
    try:
        import torch

        tracing = torch.compiler.is_compiling
    except Exception:
        return None
    try:
        from torch._C._dynamo.eval_frame import get_eval_frame_callback
    except Exception:
        return tracing, always_compiled
    return tracing, get_eval_frame_callback


def always_compiled() -> bool:
    """The frame callback's stand-in where torch has no getter for it: every call taken as compiled."""
    return True


def eager_hook(fn: Callable[..., None]) -> Callable[..., None]:
    checks = compile_checks()
    if checks is None:
        return fn
    import torch

    disabled = torch.compiler.disable(fn)
    tracing, callback = checks

    def hook(*args: Any, **kwargs: Any) -> None:
        if tracing() or callback() is not None:
            disabled(*args, **kwargs)
        else:
            fn(*args, **kwargs)

    return hook
