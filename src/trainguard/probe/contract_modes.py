"""Training and evaluation modes: evaluation run in training mode (eval-in-train-mode), training run in
eval mode after an evaluation (train-in-eval-mode), evaluation before any training forward with
batch-norm statistics never updated (eval-before-train-init), and, under preflight, an evaluation that
gives another output for the same batch (eval-not-deterministic).

Metadata only (`module.training`, whether gradients are on, the phase the script named): no device work,
except the once-per-run read of a batch-norm counter and preflight's second evaluation of one batch.
"""

from __future__ import annotations

from typing import Any

from trainguard.probe.contract_context import MAX_NAMES, CheckContext, tensors
from trainguard.rules.contracts import (
    EvalBeforeTrainInit,
    EvalInTrainMode,
    EvalNotDeterministic,
    TrainInEvalMode,
)

EVAL_PHASES = frozenset({"eval", "evaluate", "evaluation", "val", "valid", "validate", "validation", "test"})
NO_GRAD_STREAK = 3  # forwards in a row under no_grad in training mode, outside an eval phase: an eval loop
EVAL_MODE_STEPS = 3  # optimizer steps in a row trained in eval mode, after training mode was seen (TG217)


class ModeChecks:
    """The model's train/eval mode against what its forwards do (gradients on or off, the phase)."""

    def __init__(self, ctx: CheckContext) -> None:
        self.ctx = ctx
        self.mode_modules: list[tuple[str, Any]] = []  # the layers whose behaviour depends on the mode
        self.bn_modules: list[tuple[str, Any]] = []  # ... the batch-norm ones among them
        self.last_train_step = 0  # the last optimizer step a training-mode forward came before
        self.eval_mode_steps: list[int] = []  # optimizer steps in a row trained in eval mode only (TG217)
        self.det_checks = 0  # evaluation batches run twice (preflight)

    def survey(self, model: Any) -> None:
        """The model's dropout and batch-norm layers (a model found later replaces those found before)."""
        from torch import nn

        self.mode_modules, self.bn_modules = [], []
        for name, m in model.named_modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats:
                self.mode_modules.append((name, m))
                self.bn_modules.append((name, m))
            elif isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0:
                self.mode_modules.append((name, m))
            elif isinstance(m, nn.RNNBase) and m.dropout > 0 and m.num_layers > 1:
                self.mode_modules.append((name, m))

    def train_mode_without_grad(self, module: Any) -> None:
        """A forward in training mode with gradients off: evaluation, unless it is a one-off."""
        ctx = self.ctx
        if EvalInTrainMode.name in ctx.sent or not self.mode_modules:
            return
        phases = [p for p in ctx.guard.phases.stack if str(p).lower() in EVAL_PHASES]
        ctx.no_grad_streak += 1
        if not phases and ctx.no_grad_streak < NO_GRAD_STREAK:
            return
        active = [(n, m) for n, m in self.mode_modules if m.training]
        if not active:
            return  # the user switched the dropout and batch-norm layers to eval themselves
        ctx.report(EvalInTrainMode.name, {
            "model": type(module).__name__, "phase": phases[-1] if phases else None,
            "forwards": ctx.no_grad_streak,
            "modules": [f"{n or '(root)'} ({type(m).__name__})" for n, m in active[:MAX_NAMES]],
            "module_count": len(active),
        })

    def close_window(self, step: int) -> None:
        """An optimizer step whose forwards all ran in eval mode with gradients on, after the model had
        trained in training mode: `model.train()` not called after an evaluation (TG217), at
        EVAL_MODE_STEPS steps in a row. (Called only for a step that had a forward with gradients.)"""
        ctx = self.ctx
        if ctx.window_train:
            self.last_train_step = step
            self.eval_mode_steps = []
        elif TrainInEvalMode.name not in ctx.sent and TrainInEvalMode.name not in ctx.off:
            self.eval_mode_steps.append(step)
            if len(self.eval_mode_steps) >= EVAL_MODE_STEPS:
                stuck = [(n, m) for n, m in self.mode_modules if not m.training]
                if stuck:
                    ctx.report(TrainInEvalMode.name, {
                        "model": type(ctx.module).__name__, "steps": self.eval_mode_steps[:10],
                        "last_train_step": self.last_train_step,
                        "modules": [f"{n or '(root)'} ({type(m).__name__})" for n, m in stuck[:MAX_NAMES]],
                        "module_count": len(stuck),
                    }, step=self.eval_mode_steps[0])
        ctx.window_train = ctx.window_eval_grad = False

    def eval_before_train(self) -> None:
        """An eval-mode forward after optimizer steps, with no training-mode forward ever seen."""
        ctx = self.ctx
        untouched = []
        for name, m in self.bn_modules:
            tracked = getattr(m, "num_batches_tracked", None)
            # Evaluation is rare and off the hot path: this reads one small counter, once per run.
            if tracked is not None and int(tracked) == 0:
                untouched.append(f"{name} ({type(m).__name__})")
        if untouched:
            ctx.report(EvalBeforeTrainInit.name, {
                "steps_trained": ctx.guard.step_count, "modules": untouched[:MAX_NAMES],
                "module_count": len(untouched), "model": type(ctx.module).__name__,
            })

    def evaluation_twice(self, module: Any, args: Any, kwargs: Any, output: Any) -> None:
        """Preflight only, after an eval-mode forward: its first two evaluation batches under no_grad are
        run a second time (`rerun`)."""
        ctx = self.ctx
        if self.det_checks < 2 and EvalNotDeterministic.name not in ctx.off:
            if not ctx.grad_enabled():
                self.det_checks += 1
                try:
                    self.rerun(module, args, kwargs, output)
                except Exception as exc:
                    ctx.failed(EvalNotDeterministic.name, exc)

    def rerun(self, module: Any, args: Any, kwargs: Any, output: Any) -> None:
        """Preflight only: the same evaluation batch through the model a second time must give the same
        output (a sync, once or twice per preflight)."""
        ctx = self.ctx
        ctx.rerunning = True
        try:
            again = module(*args, **kwargs)
        finally:
            ctx.rerunning = False
        diff = _first_difference(tensors(output), tensors(again))
        if diff is not None:
            ctx.report(EvalNotDeterministic.name, {"model": type(module).__name__, **diff})


def _first_difference(first: list[Any], second: list[Any], rel: float = 1e-3) -> dict[str, Any] | None:
    """Where two evaluations of the same batch differ by more than numerical noise, or None."""
    import torch

    for i, (a, b) in enumerate(zip(first, second)):
        if a.shape != b.shape:
            return {"output": i, "first_shape": list(a.shape), "second_shape": list(b.shape)}
        if not a.is_floating_point():
            if not torch.equal(a, b):
                idx = int((a != b).reshape(-1).nonzero()[0])
                return {"output": i, "index": idx, "first": a.reshape(-1)[idx].item(),
                        "second": b.reshape(-1)[idx].item(), "differing": int((a != b).sum())}
            continue
        a32, b32 = a.detach().float(), b.detach().float()
        delta = (a32 - b32).abs()
        scale = max(float(a32.abs().max()), 1e-12) if a32.numel() else 1.0
        worst = float(delta.max()) if delta.numel() else 0.0
        if worst > rel * scale:
            idx = int(delta.reshape(-1).argmax())
            return {"output": i, "shape": list(a.shape), "index": idx,
                    "first": round(float(a32.reshape(-1)[idx]), 6), "second": round(float(b32.reshape(-1)[idx]), 6),
                    "max_abs_diff": worst, "differing": int((delta > rel * scale).sum()), "elements": a.numel()}
    return None
