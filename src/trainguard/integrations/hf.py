"""Hugging Face Trainer: `trainer = Trainer(..., callbacks=[TrainguardCallback()])`.

What the callback maps onto the probe:
- the plan from `TrainingArguments` and the trainer state: `state.max_steps` optimizer steps (a Trainer
  step is one optimizer update), the accumulation, warmup, eval/save strategy (stored as the run's config);
- the loss of every micro-batch, read from the model's own output (`outputs.loss`) by a forward hook, so
  a NaN is seen even though the Trainer's logged average drops it (`logging_nan_inf_filter`); one
  `guard.step` per optimizer step with the mean of its micro-batches (a device tensor, no host sync);
- LR, gradient norm, update ratio and non-finite gradients from the optimizer's step hooks;
- phases `train` and `eval`, eval metrics (`on_evaluate`), checkpoints (`on_save`), a resumed run;
- under `trainguard preflight`, an evaluation and a checkpoint after the first step (`control` flags), so
  the rare paths run in the first minute.
"""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING, Any

from transformers import TrainerCallback

import trainguard
from trainguard.contract import ENV_RESUME_FROM
from trainguard.integrations import fail_open, under_preflight, unwrap

if TYPE_CHECKING:
    from trainguard.probe.guard import Guard
    from trainguard.probe.null import NullGuard


class TrainguardCallback(TrainerCallback):
    """Watches a Hugging Face Trainer run with trainguard's probe."""

    def __init__(self, *, run_dir: str | os.PathLike[str] | None = None, name: str | None = None,
                 stats_every: int = 10) -> None:
        self.run_dir = run_dir
        self.name = name
        self.stats_every = stats_every
        self.guard: Guard | NullGuard | None = None
        self._losses: list[Any] = []
        self._hook: Any = None
        self._train_phase: Any = None
        self._eval_phase: Any = None
        self._saw_loss = False  # the model's outputs carry a loss (else the Trainer's logged one is used)

    # -- Trainer events, in the order they come ---------------------------------------------------

    @fail_open
    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, optimizer: Any = None,
                       lr_scheduler: Any = None, **kwargs: Any) -> None:
        """Called once before the first step: the plan is known, the optimizer exists."""
        opt = unwrap(optimizer, "optimizer")
        sched = unwrap(lr_scheduler, "scheduler")
        # One guard.step per Trainer step: the guard counts optimizer updates, as the Trainer does.
        self.guard = trainguard.watch(model, opt, sched, total_steps=state.max_steps or None, grad_accum=1,
                                      run_dir=self.run_dir, name=self.name or "hf-trainer",
                                      config=_plan(args, state), stats_every=self.stats_every)
        if model is not None and hasattr(model, "register_forward_hook"):
            self._hook = model.register_forward_hook(self._on_forward)
        self._train_phase = self.guard.phase("train")
        self._train_phase.__enter__()
        if (state.global_step or 0) > 0:  # the Trainer loaded a checkpoint: steps continue from there
            self.guard.set_step(state.global_step)
            wanted = self.guard.resume_from  # (read, so preflight sees its checkpoint round trip taken)
            self.guard.log(resumed_at_step=float(state.global_step), resumed_as_asked=float(wanted is not None))

    @fail_open
    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """After clipping, before the optimizer step: close the step with its micro-batches' mean loss.

        Before the step rather than after, so the guard knows from the first step that losses come
        (the optimizer hooks then wait for them instead of recording a step without its loss).
        """
        if self.guard is None:
            return
        losses, self._losses = self._losses, []
        if losses:
            import torch

            self.guard.step(torch.stack([v.detach().float().reshape(()) for v in losses]).mean())

    @fail_open
    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        """After each optimizer step. Under `trainguard preflight`, ask the guard whether evaluation and
        saving are due: preflight brings them forward (after a few real steps), and the Trainer's own
        control flags make them run, with the Trainer's own code."""
        if self.guard is None or not under_preflight():
            return control
        for name, strategy, every in (("eval", args.eval_strategy, args.eval_steps),
                                      ("save", args.save_strategy, args.save_steps)):
            if _strategy(strategy) == "no":
                continue
            if self.guard.due(name, every=_every(_strategy(strategy), every, state, args)):
                if name == "eval":
                    control.should_evaluate = True
                else:
                    control.should_save = True
        return control

    @fail_open
    def on_prediction_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Each evaluation batch: the first one opens the `eval` phase."""
        if self.guard is not None and self._eval_phase is None:
            self._eval_phase = self.guard.phase("eval")
            self._eval_phase.__enter__()

    @fail_open
    def on_evaluate(self, args: Any, state: Any, control: Any, metrics: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if self.guard is None:
            return
        if self._eval_phase is not None:
            self._eval_phase.__exit__(None, None, None)
            self._eval_phase = None
        values = {k.removeprefix("eval_"): v for k, v in (metrics or {}).items()
                  if isinstance(v, (int, float)) and not k.endswith(("_runtime", "_per_second")) and k != "epoch"}
        if values:
            self.guard.eval(**values)

    @fail_open
    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.guard is not None:
            self.guard.checkpoint_saved(os.path.join(args.output_dir, f"checkpoint-{state.global_step}"))

    @fail_open
    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        # Without a loss in the model's outputs (a custom compute_loss), the logged average is all there is.
        if self.guard is not None and not self._saw_loss and logs and "loss" in logs:
            self.guard.log(logged_loss=float(logs["loss"]))

    @fail_open
    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.guard is None:
            return
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if self._train_phase is not None:
            self._train_phase.__exit__(None, None, None)
            self._train_phase = None
        self.guard.finish()

    # -- the forward hook ---------------------------------------------------------------------------

    def _on_forward(self, module: Any, inputs: Any, output: Any) -> None:
        # Training forwards only (evaluation runs under no_grad); the tensor stays on the device.
        try:
            if not module.training:
                return
            import torch

            if not torch.is_grad_enabled():
                return
            loss = output.get("loss") if isinstance(output, dict) else getattr(output, "loss", None)
            if loss is not None and hasattr(loss, "detach") and loss.numel() == 1:
                self._losses.append(loss.detach())
                self._saw_loss = True
        except Exception:  # the guard never becomes the failure
            return


def resume_checkpoint() -> str | None:
    """The checkpoint folder `trainguard run --on-hang restart` or preflight asks this run to resume from.

        trainer.train(resume_from_checkpoint=resume_checkpoint())
    """
    return os.environ.get(ENV_RESUME_FROM) or None


def _strategy(value: Any) -> str:
    return str(getattr(value, "value", value)).lower()


def _every(strategy: str, steps: Any, state: Any, args: Any) -> int:
    """An eval/save interval in optimizer steps, as the Trainer computes it."""
    total = int(state.max_steps or 0)
    if strategy == "epoch":
        epochs = max(1, math.ceil(float(args.num_train_epochs or 1)))
        return max(1, total // epochs) if total else 1
    value = float(steps or args.logging_steps or 1)
    return max(1, math.ceil(total * value)) if value < 1 and total else max(1, int(value))


def _plan(args: Any, state: Any) -> dict[str, Any]:
    """What the run means to do, from TrainingArguments and the state (stored as the run's config)."""
    keys = ("max_steps", "num_train_epochs", "gradient_accumulation_steps", "per_device_train_batch_size",
            "learning_rate", "lr_scheduler_type", "warmup_steps", "warmup_ratio", "eval_strategy",
            "eval_steps", "save_strategy", "save_steps", "logging_steps", "logging_nan_inf_filter",
            "max_grad_norm", "output_dir", "resume_from_checkpoint", "fp16", "bf16")
    plan = {k: _plain(getattr(args, k, None)) for k in keys}
    plan["total_steps"] = state.max_steps
    plan["framework"] = "transformers"
    return plan


def _plain(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(getattr(value, "value", value))
