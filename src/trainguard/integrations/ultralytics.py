"""Ultralytics (YOLO): `trainguard.integrations.ultralytics.attach(model)` before `model.train(...)`.

    from ultralytics import YOLO
    model = YOLO("yolov8n.yaml")
    attach(model)
    model.train(data=..., epochs=100)       # best run under `trainguard run -- python train.py`

The callbacks registered (`model.add_callback`, the library's own mechanism) map the trainer's events
onto the probe: the guard starts at `on_pretrain_routine_end` (the optimizer, scheduler and GradScaler
exist then); each batch's loss and its named parts (`trainer.loss_items`, `trainer.loss_names`) are
collected as device tensors and closed into a step when the optimizer has stepped (Ultralytics changes
its accumulation during warmup, so the optimizer's own step hooks, not a fixed `grad_accum`, say when
a step ends); validation is the `eval` phase between `on_train_epoch_end` and `on_fit_epoch_end`, with
`trainer.metrics` as its results; `on_model_save` reports `trainer.last`. Seed 003 hung right after
validation and checkpointing: under `trainguard run` the phase and step it stopped in are on record.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import trainguard
from trainguard.integrations import fail_open

if TYPE_CHECKING:
    from trainguard.probe.guard import Guard
    from trainguard.probe.null import NullGuard

EVENTS = ("on_pretrain_routine_end", "on_train_start", "on_train_batch_end", "on_train_epoch_end",
          "on_fit_epoch_end", "on_model_save", "on_train_end")


class UltralyticsAdapter:
    """The state of one attached training run; its methods are the registered callbacks."""

    def __init__(self, run_dir: Any = None, name: str | None = None, stats_every: int = 10) -> None:
        self.run_dir = run_dir
        self.name = name
        self.stats_every = stats_every
        self.guard: Guard | NullGuard | None = None
        self._losses: list[Any] = []
        self._parts: list[Any] = []
        self._closed = 0
        self._phases: dict[str, Any] = {}

    @fail_open
    def on_pretrain_routine_end(self, trainer: Any) -> None:
        """The trainer is set up: model, optimizer, scheduler, scaler and data loaders exist."""
        nb = _len(getattr(trainer, "train_loader", None))
        accum = max(1, int(getattr(trainer, "accumulate", 1) or 1))
        epochs = int(getattr(trainer, "epochs", 0) or 0)
        total = epochs * math.ceil(nb / accum) if nb and epochs else None  # warmup steps more often: a floor
        self.guard = trainguard.watch(
            getattr(trainer, "model", None), getattr(trainer, "optimizer", None),
            getattr(trainer, "scheduler", None), total_steps=total, grad_accum=1,
            scaler=getattr(trainer, "scaler", None), run_dir=self.run_dir, name=self.name or "ultralytics",
            config={"framework": "ultralytics", "epochs": epochs, "batches_per_epoch": nb, "accumulate": accum,
                    "args": _args(getattr(trainer, "args", None))},
            stats_every=self.stats_every)

    @fail_open
    def on_train_start(self, trainer: Any) -> None:
        self._begin("train")

    @fail_open
    def on_train_batch_end(self, trainer: Any) -> None:
        """After each batch: its loss parts; a step closes once the optimizer has stepped."""
        if self.guard is None:
            return
        import torch

        items = getattr(trainer, "loss_items", None)
        names = list(getattr(trainer, "loss_names", None) or [])
        if isinstance(items, dict):  # 8.4 and later: {name: tensor}
            names, items = list(items), torch.stack([torch.as_tensor(v).detach().float().reshape(()) for v in items.values()])
        if items is not None and hasattr(items, "detach"):
            items = items.detach().float().reshape(-1)
            self._parts.append(items)
            self._losses.append(items.sum())
        opt_steps = getattr(self.guard, "opt_steps", 0)  # a NullGuard (TRAINGUARD_DISABLE) has none
        if opt_steps > self._closed and self._losses:
            self._closed = opt_steps
            loss = torch.stack(self._losses).mean()
            mean_parts = torch.stack(self._parts).mean(0)
            parts = {n: mean_parts[i] for i, n in enumerate(names) if i < mean_parts.numel()}
            self._losses, self._parts = [], []
            self.guard.step(loss, parts=parts or None)

    @fail_open
    def on_train_epoch_end(self, trainer: Any) -> None:
        self._begin("eval")  # validation runs between this and on_fit_epoch_end

    @fail_open
    def on_fit_epoch_end(self, trainer: Any) -> None:
        self._end("eval")
        if self.guard is None:
            return
        metrics = {k.replace("/", "_"): v for k, v in (getattr(trainer, "metrics", None) or {}).items()
                   if isinstance(v, (int, float)) or hasattr(v, "item")}
        if metrics:
            self.guard.eval(**metrics)

    @fail_open
    def on_model_save(self, trainer: Any) -> None:
        last = getattr(trainer, "last", None)
        if self.guard is not None and last is not None:
            self.guard.checkpoint_saved(last)

    @fail_open
    def on_train_end(self, trainer: Any) -> None:
        for name in list(self._phases):
            self._end(name)
        if self.guard is not None:
            self.guard.finish()

    def _begin(self, name: str) -> None:
        if self.guard is not None and name not in self._phases:
            self._phases[name] = self.guard.phase(name)
            self._phases[name].__enter__()

    def _end(self, name: str) -> None:
        cm = self._phases.pop(name, None)
        if cm is not None:
            cm.__exit__(None, None, None)


def attach(model: Any, *, run_dir: Any = None, name: str | None = None, stats_every: int = 10) -> UltralyticsAdapter:
    """Registers trainguard's callbacks on an Ultralytics model (or trainer) with its `add_callback`."""
    if not hasattr(model, "add_callback"):
        raise TypeError(f"attach() needs an Ultralytics model or trainer (with add_callback), got {type(model).__name__}")
    adapter = UltralyticsAdapter(run_dir=run_dir, name=name, stats_every=stats_every)
    for event in EVENTS:
        model.add_callback(event, getattr(adapter, event))
    return adapter


def _len(obj: Any) -> int:
    try:
        return len(obj)
    except TypeError:
        return 0


def _args(args: Any) -> dict[str, Any]:
    if args is None:
        return {}
    keys = ("model", "data", "epochs", "batch", "imgsz", "workers", "amp", "lr0", "lrf", "warmup_epochs", "nbs",
            "cos_lr", "optimizer", "val", "save_period")
    return {k: (v if isinstance(v, (int, float, str, bool)) or v is None else str(v))
            for k in keys if (v := getattr(args, k, None)) is not None}
