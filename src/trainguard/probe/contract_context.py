"""What the contract checks share: the context each family of checks (probe/contract_*.py) is handed.

It holds the guard's parts the checks read (the probe state, the writer through `report`), which
contracts were reported or switched off, the device numbers on their way to the host, the model with
its parameter names, and what the forward pre-hook saw since the last optimizer step. The hook
dispatcher (`Contracts`, probe/contracts.py) is this context with the hooks on top: the fields its
forward pre-hook reads or writes at every forward are kept here, on the dispatcher itself, so the hot
path reads them without an extra lookup; each family keeps the rest of its state on its own object.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from trainguard.contract import EVENT_CONTRACT
from trainguard.probe import devicestats

MAX_NAMES = 10  # names listed in a contract event at most


@dataclass
class Launched:
    """Device numbers on their way to the host, with what to do once they arrive."""

    step: int
    host: Any
    event: Any
    then: Any  # callable(values: list[float]) run on the background thread
    extra: dict[str, Any] = field(default_factory=dict)

    def ready(self) -> bool:
        return self.event is None or self.event.query()


class CheckContext:
    """What every family of contract checks reads and reports through (the dispatcher is one)."""

    def __init__(self, guard: Any) -> None:
        import torch

        self.guard = guard
        self.state = guard.state  # the probe state, bound once: its counters are plain attributes
        self.every = max(1, int(guard.stats_every))
        self.sent: set[str] = set()  # contracts reported (one event each: the rule needs no more)
        self.off: set[str] = set()  # checks switched off after an error of their own
        self.launched: list[Launched] = []
        model = guard.model
        self.module = model if isinstance(model, torch.nn.Module) else None
        self.names: dict[int, str] = {}
        if self.module is not None:
            self.names = {id(p): n for n, p in self.module.named_parameters()}
        # Replicas are compared only where they must be identical: a DistributedDataParallel model (FSDP,
        # ZeRO and tensor parallelism hold different shards under the same names on each rank).
        ddp = getattr(getattr(torch.nn, "parallel", None), "DistributedDataParallel", None)
        replicated = ddp is not None and isinstance(model, ddp)
        self.world = int(os.environ.get("WORLD_SIZE", "1") or 1) if replicated else 1
        self.tensor_type = torch.Tensor
        self.grad_enabled = torch.is_grad_enabled
        # -- what the forward pre-hook saw since the last optimizer step (read and reset by the families)
        self.rerunning = False  # the determinism check runs the model a second time (its hooks stand aside)
        self.window_train = False  # a training-mode forward with gradients since the last optimizer step
        self.window_eval_grad = False  # ... an eval-mode forward with gradients (training in eval mode?)
        self.no_grad_streak = 0  # training-mode forwards in a row with gradients off
        self.batch_shapes: list[tuple[int, ...]] = []  # the model's first input on the first training forwards
        self.batch_ndim: int | None = None  # their common rank, once BATCH_SHAPES_LEARNED of them agree

    def sampled(self, step: int) -> bool:
        return step <= 3 or step % self.every == 0

    def name(self, p: Any, fallback: str = "?") -> str:
        return self.names.get(id(p), fallback)

    def report(self, name: str, data: dict[str, Any], step: int | None = None) -> None:
        """One contract event per contract and run: the rule makes the finding, more events add nothing."""
        if name in self.sent:
            return
        self.sent.add(name)
        self.guard.writer.add_event(EVENT_CONTRACT, name, data, step=self.guard.step_count if step is None else step)

    def failed(self, check: str, exc: BaseException) -> None:
        self.off.add(check)
        self.guard.fail(f"contract check {check} (switched off)", exc)

    def launch(self, step: int, vec: Any, then: Any, **extra: Any) -> None:
        """Starts the copy of a small device vector to the host; `then(values)` runs when it is there."""
        host, event = vec, None
        if vec.device.type == "cuda":
            host, event = devicestats.copy_to_host(vec)
        self.launched.append(Launched(step, host, event, then, extra))


def first_tensor(value: Any) -> Any:
    found = tensors(value, limit=1)
    return found[0] if found else None


def tensors(value: Any, limit: int = 8, depth: int = 0) -> list[Any]:
    """The tensors in a model output or a batch (a tensor, tuple, list, dict or dict-like output)."""
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if depth > 3:
        return []
    items: Iterable[Any] = ()
    if isinstance(value, dict):
        items = value.values()
    elif isinstance(value, (list, tuple)):
        items = value
    out: list[Any] = []
    for v in items:
        out.extend(tensors(v, limit - len(out), depth + 1))
        if len(out) >= limit:
            break
    return out[:limit]
