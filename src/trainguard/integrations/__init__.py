"""Thin adapters from training frameworks onto the probe: Hugging Face, Lightning, Ultralytics.

Each maps the framework's own events onto `trainguard.watch(...)` and the guard's methods; none holds
a rule. Framework modules are imported only by the adapter that needs them.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

from trainguard.contract import ENV_PREFLIGHT


def under_preflight() -> bool:
    """True when `trainguard preflight` runs this script: rare paths (eval, save) should come early."""
    return os.environ.get(ENV_PREFLIGHT, "") not in ("", "0")


def unwrap(obj: object, attr: str) -> object:
    """The torch object inside a wrapper (accelerate's AcceleratedOptimizer/Scheduler keep it in `attr`)."""
    for _ in range(4):
        inner = getattr(obj, attr, None)
        if inner is None or inner is obj or type(obj).__module__.startswith("torch."):
            break
        obj = inner
    return obj


def fail_open(method: Callable[..., Any]) -> Callable[..., Any]:
    """Wraps a framework hook: an error of the adapter goes to the run's guard.log, never into the training.

    A preflight stop (a SystemExit) passes through: it is meant to end the script.
    """

    @functools.wraps(method)
    def hook(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except Exception as exc:  # the guard never becomes the failure
            fail = getattr(getattr(self, "guard", None), "_fail", None)
            if fail is not None:
                fail(f"{type(self).__name__}.{method.__name__}", exc)
            return None

    return hook
