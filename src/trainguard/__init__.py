"""trainguard keeps deep-learning training runs honest.

    import trainguard
    guard = trainguard.watch(model, optimizer, scheduler, total_steps=10_000, grad_accum=8)

This module stays light: nothing here imports torch; the probe is loaded when `watch` is called.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from trainguard.contract import ENV_DISABLE, ENV_STACKS
from trainguard.findings import Finding
from trainguard.probe.null import NullGuard  # light (no torch): `watch`'s return path when not watching

__version__ = "0.2.0"

if TYPE_CHECKING:
    from trainguard.probe.guard import Guard

__all__ = ["Finding", "Guard", "NullGuard", "__version__", "watch"]


def watch(
    model: Any = None,
    optimizer: Any = None,
    scheduler: Any = None,
    total_steps: int | None = None,
    grad_accum: int = 1,
    *,
    scaler: Any = None,
    run_dir: str | os.PathLike[str] | None = None,
    name: str | None = None,
    config: dict[str, Any] | None = None,
    stats_every: int = 10,
    learning: bool = True,
) -> Guard | NullGuard:
    """Starts watching this training process and returns its guard.

    `total_steps` is the planned number of optimizer steps and `grad_accum` the micro-batches per
    optimizer step; `scaler` is an AMP GradScaler, if any (its loss scale is watched). Alone, the run
    folder goes under ./trainguard-runs/; under `trainguard run` the probe joins that run's folder.
    `stats_every`: gradient norm and update ratio are measured every N optimizer steps (and on each
    of the first N). `learning=False`: the job runs a model without training it (an evaluation, a teacher
    writing its outputs): its "loss" is a measure that need not fall, so the rules that expect learning
    (TG204 loss-not-decreasing, TG206 loss-diverging) leave it alone. With TRAINGUARD_DISABLE=1 this returns a `NullGuard` that does nothing.
    """
    if os.environ.get(ENV_DISABLE):
        return NullGuard(grad_accum)
    from trainguard.probe import auto
    from trainguard.probe.guard import Guard, active_guard

    auto.retire()  # the script's own guard: the automatic probe (trainguard run's bootstrap) steps aside
    first = active_guard()
    if first is not None:
        # One guard per process: a second would hook the same optimizer again and write a second stream
        # of steps into the store (duplicate rows). Refused, once, in one line; finish() the first to switch.
        import sys

        print(f"trainguard: watch() called again while a guard watches this process ({first.run_dir}): "
              f"ignored, the first guard keeps watching (call guard.finish() before watching another run)",
              file=sys.stderr, flush=True)
        return NullGuard(grad_accum)
    if grad_accum < 1 or (total_steps is not None and total_steps < 1):
        # a mistake in the call itself: loud, at start-up, before any training time is spent
        raise ValueError(f"trainguard.watch: grad_accum must be >= 1 and total_steps >= 1 or None "
                         f"(got grad_accum={grad_accum}, total_steps={total_steps})")
    try:
        return Guard(model, optimizer, scheduler, total_steps=total_steps, grad_accum=grad_accum, scaler=scaler,
                     run_dir=run_dir, name=name, config=config, stats_every=stats_every,
                     learning=learning)
    except Exception as exc:
        # The guard never becomes the failure: a run folder that cannot be made or written (a full disk,
        # a read-only mount) costs the watching, not the training.
        import sys

        print(f"trainguard: not watching this run: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return NullGuard(grad_accum)


def __getattr__(name: str) -> Any:
    if name == "Guard":
        from trainguard.probe.guard import Guard

        return Guard
    raise AttributeError(f"module 'trainguard' has no attribute {name!r}")


if os.environ.get(ENV_STACKS):  # a child of a watched process (spawned worker, rank): stacks on request
    from trainguard.probe import stackdump

    stackdump.install_from_env()
