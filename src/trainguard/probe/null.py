"""A guard that does nothing, with the same methods: disabled means a null object, not an `if`."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

from trainguard.contract import ENV_RESUME_FROM

_Batch = TypeVar("_Batch")  # what the loader yields: guard.batches(loader) yields the same


class NullGuard:
    """Records nothing, but still counts steps so the loop's `due()` answers as it would when guarded."""

    run_dir = None
    finished = False

    def __init__(self, grad_accum: int = 1) -> None:
        self.grad_accum = max(1, int(grad_accum))
        self.micro = 0
        self._due_last: dict[str, int] = {}

    @property
    def step_count(self) -> int:
        return self.micro // self.grad_accum

    @property
    def resume_from(self) -> str | None:
        return os.environ.get(ENV_RESUME_FROM) or None

    def step(self, loss: Any, parts: Any = None, weights: Any = None) -> None:
        self.micro += 1

    def set_step(self, step: int) -> None:
        self.micro = int(step) * self.grad_accum

    def log(self, **values: Any) -> None:
        pass

    def batches(self, iterable: Iterable[_Batch]) -> Iterator[_Batch]:
        yield from iterable

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        yield

    def due(self, name: str, every: int) -> bool:
        step = self.step_count
        if every <= 0 or step <= 0 or step % every != 0 or self._due_last.get(name) == step:
            return False
        self._due_last[name] = step
        return True

    def eval(self, **metrics: Any) -> None:
        pass

    def experts(self, load: Any, layer: Any = None) -> None:
        pass

    def checkpoint_saved(self, path: Any) -> None:
        pass

    @property
    def stop_requested(self) -> bool:
        return False

    def finish(self) -> None:
        pass

    def __enter__(self) -> NullGuard:
        return self

    def __exit__(self, *exc: object) -> None:
        pass
