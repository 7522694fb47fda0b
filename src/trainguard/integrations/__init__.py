"""Thin adapters from training frameworks onto the probe: Hugging Face, Lightning, Ultralytics.

Each maps the framework's own events onto `trainguard.watch(...)` and the guard's methods; none holds
a rule. Framework modules are imported only by the adapter that needs them.
"""

from __future__ import annotations

import os

ENV_PREFLIGHT = "TRAINGUARD_PREFLIGHT"


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
