"""TG2xx: is the run learning? Weights that do not move, losses that do not fall or blow up."""

from __future__ import annotations

from typing import Any

from trainguard.findings import PROBE, UPDATE_RATIO, Finding
from trainguard.rules.rule import Rule, Streak, finite, fmt
from trainguard.rules.schedule import step_lr

FIXES_201 = {
    "lr-zero": "find what sets the LR to 0: a scheduler sized in micro-batches or epochs that ran out, a warm-up "
               "that starts at 0 and never rises, an `lr` argument of 0; print optimizer.param_groups[0]['lr'] "
               "at a few steps",
    "zero-grad": "make the loss from the model's output without .detach(), .item(), .numpy() or a new tensor in "
                 "between, and call loss.backward() before optimizer.step()",
    "not-in-optimizer": "build the optimizer after the model is complete, from model.parameters() (or add the "
                        "missing parameters as a param group)",
    "wrong-params": "build the optimizer from model.parameters() once the model is final (after .to(device), after "
                    "wrapping); check that loss.backward() runs before optimizer.step()",
}


class WeightsNotUpdating(Rule):
    """TG201 weights-not-updating: optimizer steps that change no weight.

    ## What it detects
    Two sampled optimizer steps in a row whose update ratio (the norm of the change of a sample of
    the model's trainable weights over their norm, measured by the probe on the first `stats_every`
    steps and every `stats_every` steps after) is exactly zero. The finding says which of the usual
    causes the numbers point to: an LR of zero, all gradients zero, a compiled `optimizer.step` that
    replays a no-op, or an optimizer that does not hold the model's parameters.

    ## Why it matters
    A step that changes nothing costs a full step. Seed 002's evaluation loss read 101.40 three times in
    a row because no weight moved. Under `torch.compile(optimizer.step)` a cached graph traced at a step
    whose gradients were all None is a no-op; without a guard on the gradients it replays at every later
    step (pytorch/pytorch#115607, "module: correctness (silent)": the optimizer's `step` count stayed at
    3 while the loop went on).

    ## Example
    `TG201 weights-not-updating [error] at step 1: 2 sampled optimizer steps in a row changed no weight
    (update ratio 0; lr 1.00e-03, grad norm 2.31): the optimizer does not hold the model's parameters`

    ## What to change
    The fix follows the cause the numbers name. An LR of 0: find what sets it there (a schedule sized
    in micro-batches or epochs that ran out, a warm-up that starts at 0); rebuilding the optimizer
    will not help. Zero gradients: make the loss from the model's output without detaching it. Wiring:
    build the optimizer from `model.parameters()` after the model is final (after `.to(device)`,
    after wrapping) and call `loss.backward()` before `optimizer.step()`. For a
    compiled step: run `optimizer.step()` uncompiled to confirm, keep dynamo's guards (no
    `guard_filter_fn` that drops them), never call the compiled step while every gradient is None, and
    use torch >= 2.3 (pytorch/pytorch#121291 added the missing guard).

    ## Known false positives
    Weights in a dtype too coarse for the update (bf16 weights with a tiny LR) also read as zero: a
    real problem, but of precision, not of wiring.

    ## Options
    `trainguard.watch(stats_every=N)` sets how often the update ratio is sampled.
    """

    code, name, severity = "TG201", "weights-not-updating", "error"
    needs = (UPDATE_RATIO,)

    def __init__(self, plan: dict[str, Any]) -> None:
        super().__init__(plan)
        self.zeros = Streak()  # sampled steps in a row with an update ratio of 0
        self.zero_first: dict[str, Any] = {}  # the first of them: its LR and grad norm name the cause
        self.not_in_optimizer: dict[str, Any] | None = None
        self.compiled: dict[str, Any] | None = None  # the probe saw optimizer.step run under torch.compile

    def on_event(self, event: dict[str, Any]) -> None:
        if event.get("kind") == "params-not-in-optimizer":
            self.not_in_optimizer = event.get("data") or {}
        elif event.get("kind") == "contract" and event.get("name") == "optimizer-step-compiled":
            self.compiled = event.get("data") or {}

    def on_step(self, row: dict[str, Any]) -> Finding | None:
        ratio = row.get("update_ratio")
        if not finite(ratio):
            return None
        if ratio > 0:
            self.zeros.clear()
            return None
        if not self.zeros.count:
            self.zero_first = row
        self.zeros.add(row["step"])
        if self.zeros.count < 2:
            return None
        first = self.zero_first
        lr, gn = step_lr(first), first.get("grad_norm")  # the largest LR: one group at 0 (a warmup) is not "LR 0"
        # the structural fact first: parameters the optimizer does not hold explain an LR or a gradient seen
        # as 0 on the copy it does hold (Ultralytics' warm-up starts its bias group at 0)
        if self.not_in_optimizer:
            why = f"{self.not_in_optimizer.get('count')} trainable parameters are not in the optimizer"
            cause = "not-in-optimizer"
        elif finite(lr) and lr == 0:
            why, cause = "the learning rate is 0", "lr-zero"
        elif finite(gn) and gn == 0:
            why, cause = "every gradient is zero (is the loss detached from the model?)", "zero-grad"
        elif self.compiled is not None:
            why = (f"{self.compiled.get('optimizer', 'the optimizer')}.step runs under torch.compile and changes "
                   f"nothing: a cached graph traced when the gradients were None replays a no-op")
            cause = "compiled-step"
        else:
            why, cause = "the optimizer does not update the model's parameters", "wrong-params"
        # the fix is written for the cause the numbers name: rebuilding the optimizer cannot help an LR of 0
        fix = FIXES_201.get(cause, FIXES_201["wrong-params"])
        if cause == "compiled-step":
            fix = ("run optimizer.step() uncompiled to confirm; keep dynamo's guards (no guard_filter_fn that drops "
                   "them), do not call the compiled step while every gradient is None, use torch >= 2.3 "
                   "(pytorch/pytorch#115607)")
        return self.finding(
            step=first["step"],
            summary=f"{self.zeros.count} sampled optimizer steps in a row changed no weight (update ratio 0; "
                    f"lr {fmt(lr)}, grad norm {fmt(gn)}): {why}",
            fix=fix,
            evidence={"steps": list(self.zeros.steps), "update_ratio": 0.0, "lr": lr, "grad_norm": gn,
                      "detected_step": row["step"], "params_not_in_optimizer": self.not_in_optimizer,
                      "optimizer_step_compiled": self.compiled is not None},
            cause=cause,
        )


class ParamsWithoutGrad(Rule):
    """TG202 params-without-grad: trainable parameters that never get a gradient or are in no optimizer group.

    ## What it detects
    Two things the probe sees: at `trainguard.watch`, model parameters with `requires_grad=True` that
    are in no param group of the optimizer; and during training, parameters in the optimizer that have
    no gradient at every sampled step since the start (they are not in the graph of the loss).

    ## Why it matters
    Those parameters never learn, silently: a new head left out of the optimizer, a branch the
    forward never uses, a module re-created after the optimizer was built. Under DDP the second kind
    also breaks gradient reduction.

    ## Example
    `TG202 params-without-grad [warning] at step 0: 2 of 6 trainable parameters are in no optimizer
    param group: head.weight, head.bias`

    ## What to change
    Build the optimizer after the model is complete; set `requires_grad_(False)` on what is frozen on
    purpose; remove or use the unused branch. When torch's reentrant activation checkpointing warned
    "None of the inputs have requires_grad=True" (LoRA adapters inside checkpointed blocks of a frozen
    model), the parameters are meant to train: the finding says so (cause `reentrant-checkpoint`) and
    asks for `use_reentrant=False` or an input that requires grad, never to freeze them.

    ## Known false positives
    Mixture-of-experts layers where an expert receives no token at some steps (their gradient is
    None then), if that happens at every sampled step.

    ## Options
    None.
    """

    code, name, severity = "TG202", "params-without-grad", "warning"
    needs = (PROBE,)
    MIN_SAMPLES = 5

    def __init__(self, plan: dict[str, Any]) -> None:
        super().__init__(plan)
        self.samples: list[tuple[int, int]] = []
        self.broken = False
        self.checkpointed = False  # torch's reentrant checkpoint warned that none of its inputs require grad

    def on_event(self, event: dict[str, Any]) -> Finding | None:
        if event.get("kind") != "params-not-in-optimizer":
            return None
        d = event.get("data") or {}
        names = d.get("names") or []
        return self.finding(
            step=event.get("step") or 0,
            summary=f"{d.get('count')} of {d.get('total_trainable')} trainable parameters are in no optimizer "
                    f"param group: {', '.join(names[:5])}{' ...' if len(names) > 5 else ''}",
            fix="build the optimizer after the model is complete, or requires_grad_(False) what is frozen on purpose",
            evidence=d, cause="not-in-optimizer",
        )

    def on_step(self, row: dict[str, Any]) -> Finding | None:
        if self.broken or not finite(row.get("grad_norm")):
            return None  # only sampled steps count gradients
        extra = row.get("extra") or {}
        missing = extra.get("params_without_grad") or 0
        if not missing:
            self.broken = True  # some sampled step had every gradient: not "never"
            return None
        self.checkpointed = self.checkpointed or bool(extra.get("checkpoint_inputs_no_grad"))
        self.samples.append((row["step"], int(missing)))
        if len(self.samples) < self.MIN_SAMPLES:
            return None
        self.broken = True
        counts = [c for _, c in self.samples]
        head = (f"{min(counts)} parameter tensors in the optimizer had no gradient at every one of the "
                f"{len(counts)} sampled steps since step {self.samples[0][0]}")
        if self.checkpointed:
            # The fix is written for this cause: they are meant to train (LoRA adapters inside checkpointed
            # blocks of a frozen model); freezing them, the generic advice, would stop what the run is for.
            return self.finding(
                step=self.samples[0][0], cause="reentrant-checkpoint",
                summary=f"{head}: torch's reentrant activation checkpointing warned that none of its inputs "
                        "require grad, so nothing inside the checkpointed blocks gets a gradient",
                fix="pass use_reentrant=False to torch.utils.checkpoint.checkpoint (Hugging Face: "
                    "gradient_checkpointing_enable(gradient_checkpointing_kwargs={'use_reentrant': False})), or make "
                    "the block's input require grad (model.enable_input_require_grads()); do not freeze these "
                    "parameters: they are the ones meant to train",
                evidence={"samples": self.samples, "checkpoint_inputs_no_grad": True, "detected_step": row["step"]},
            )
        return self.finding(
            step=self.samples[0][0],
            summary=f"{head}: they are not in the loss's graph",
            fix="use or remove the unused module, or requires_grad_(False) what is frozen on purpose",
            evidence={"samples": self.samples, "detected_step": row["step"]}, cause="never-grad",
        )
