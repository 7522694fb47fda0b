"""What trainguard's hooks become when a watched model is pickled (`torch.save(model)`, Ultralytics'
checkpoints): nothing. Torch pickles a module's hook dicts with it, and the hooks are bound to the
process's guard, which holds locks and threads and belongs to this process only; a model loaded elsewhere
must not carry it. Each of the guard's hook owners pickles as `Detached`, whose every attribute is a no-op.
"""

from __future__ import annotations

from typing import Any


def _noop(*args: Any, **kwargs: Any) -> None:
    return None


class Detached:
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _noop

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        return None
