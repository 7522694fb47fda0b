"""Lightning: `Trainer(callbacks=[TrainguardCallback()])`.

What the callback maps onto the probe:
- the plan from the trainer: `estimated_stepping_batches` optimizer steps, `accumulate_grad_batches`;
- the loss of every micro-batch from `training_step`'s output (`on_train_batch_end`), the run's logged
  metrics as extras; LR, gradient norm, update ratio and non-finite gradients from the optimizer's step
  hooks (the first optimizer);
- phases `sanity-check`, `train` and `eval` (validation), validation metrics, checkpoints written by a
  `ModelCheckpoint`, a run resumed from `ckpt_path`.

Preflight works with Lightning's own sanity check, not against it: the sanity check already runs the
validation path before the first step, so under `trainguard preflight` the callback only brings the
checkpoint forward (`guard.due("save", ...)`, then `trainer.save_checkpoint`), the path a sanity check
never reaches; a script that passes `ckpt_path=guard.resume_from`-style paths gets the round trip
tested too. With `num_sanity_val_steps=0` it says so in the run's guard.log.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lightning.pytorch.callbacks import Callback

import trainguard
from trainguard.integrations import fail_open, under_preflight

if TYPE_CHECKING:
    from trainguard.probe.guard import Guard
    from trainguard.probe.null import NullGuard


class TrainguardCallback(Callback):
    """Watches a Lightning fit with trainguard's probe."""

    def __init__(self, *, run_dir: str | os.PathLike[str] | None = None, name: str | None = None,
                 stats_every: int = 10) -> None:
        self.run_dir = run_dir
        self.name = name
        self.stats_every = stats_every
        self.guard: Guard | NullGuard | None = None
        self._phases: dict[str, Any] = {}
        self._seen_ckpts: set[str] = set()

    # -- fit: start and end -------------------------------------------------------------------------

    @fail_open
    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        """Called once the optimizers exist, before the sanity check."""
        optimizers = list(getattr(trainer, "optimizers", []) or [])
        schedulers = [c.scheduler for c in getattr(trainer, "lr_scheduler_configs", []) or []]
        total = _int(getattr(trainer, "estimated_stepping_batches", None))
        accum = _int(getattr(trainer, "accumulate_grad_batches", 1)) or 1
        self.guard = trainguard.watch(
            pl_module, optimizers[0] if optimizers else None, schedulers[0] if schedulers else None,
            total_steps=total, grad_accum=accum, run_dir=self.run_dir, name=self.name or "lightning",
            config={"framework": "lightning", "max_epochs": trainer.max_epochs, "max_steps": trainer.max_steps,
                    "accumulate_grad_batches": accum, "total_steps": total,
                    "num_sanity_val_steps": trainer.num_sanity_val_steps, "ckpt_path": _str(trainer.ckpt_path),
                    "optimizers": len(optimizers)},
            stats_every=self.stats_every)
        if trainer.ckpt_path:
            wanted = self.guard.resume_from  # (read, so preflight sees its checkpoint round trip taken)
            self.guard.log(resumed_at_step=float(trainer.global_step), resumed_as_asked=float(wanted is not None))
        if under_preflight() and not trainer.num_sanity_val_steps:
            note = getattr(self.guard, "_selflog", None)  # the run's guard.log (a NullGuard has none)
            if note is not None:
                note.write("preflight: num_sanity_val_steps=0, so validation is not reached early")

    @fail_open
    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        if self.guard is None:
            return
        self._report_checkpoints(trainer)
        for name in list(self._phases):
            self._end(name)
        self.guard.finish()

    # -- phases ---------------------------------------------------------------------------------------

    @fail_open
    def on_sanity_check_start(self, trainer: Any, pl_module: Any) -> None:
        self._begin("sanity-check")

    @fail_open
    def on_sanity_check_end(self, trainer: Any, pl_module: Any) -> None:
        self._end("sanity-check")

    @fail_open
    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if self.guard is not None and trainer.ckpt_path and trainer.global_step:
            self.guard.set_step(trainer.global_step)  # restored by now: steps continue from the checkpoint
        self._begin("train")

    @fail_open
    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._end("train")

    @fail_open
    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        if not trainer.sanity_checking:
            self._begin("eval")

    @fail_open
    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if trainer.sanity_checking or self.guard is None:
            return
        self._end("eval")
        metrics = {k: v for k, v in trainer.callback_metrics.items() if k.startswith(("val", "valid"))}
        if metrics:
            self.guard.eval(**{k.split("_", 1)[-1] if "_" in k else k: v for k, v in metrics.items()})

    # -- steps ----------------------------------------------------------------------------------------

    @fail_open
    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self._report_checkpoints(trainer)

    @fail_open
    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        """After each micro-batch: its loss (a device tensor, no host sync)."""
        if self.guard is None:
            return
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if loss is not None and hasattr(loss, "detach"):
            self.guard.step(loss.detach())
        if under_preflight() and self.guard.due("save", every=_save_every(trainer)):
            # preflight brings saving forward; the sanity check already ran the validation path
            folder = Path(getattr(trainer.checkpoint_callback, "dirpath", None) or trainer.default_root_dir)
            path = folder / f"preflight-step={trainer.global_step}.ckpt"
            trainer.save_checkpoint(path)
            self.guard.checkpoint_saved(path)

    # -- helpers --------------------------------------------------------------------------------------

    def _report_checkpoints(self, trainer: Any) -> None:
        # ModelCheckpoint runs after every other callback, so a checkpoint shows at the next hook.
        if self.guard is None:
            return
        for cb in getattr(trainer, "checkpoint_callbacks", []) or []:
            for path in (getattr(cb, "last_model_path", ""), getattr(cb, "best_model_path", "")):
                if path and path not in self._seen_ckpts and os.path.exists(path):
                    self._seen_ckpts.add(path)
                    self.guard.checkpoint_saved(path)

    def _begin(self, name: str) -> None:
        if self.guard is not None and name not in self._phases:
            self._phases[name] = self.guard.phase(name)
            self._phases[name].__enter__()

    def _end(self, name: str) -> None:
        cm = self._phases.pop(name, None)
        if cm is not None:
            cm.__exit__(None, None, None)


def _save_every(trainer: Any) -> int:
    """Optimizer steps between checkpoints: ModelCheckpoint's own interval, else one epoch."""
    cb = getattr(trainer, "checkpoint_callback", None)
    every = _int(getattr(cb, "_every_n_train_steps", None))
    if every:
        return every
    batches = _int(getattr(trainer, "num_training_batches", None)) or 1
    return max(1, batches // max(1, _int(trainer.accumulate_grad_batches) or 1))


def _int(value: Any) -> int | None:
    try:
        v = int(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return v if 0 < v < 10**12 else None


def _str(value: Any) -> str | None:
    return None if value is None else str(value)
