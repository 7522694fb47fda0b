"""API contracts broken by the training code: what the probe saw (probe/contracts.py), as findings.

The probe checks each contract where the code runs and records a "contract" event with the evidence;
these rules turn the events into findings (and compare the ranks' parameter checksums, which no single
process can). The contracts come from the APIs' semantics, not from reference runs: an optimizer step
changes the parameters that have gradients and only those; `zero_grad` resets what `backward` adds;
`model.eval()` switches dropout and batch norm to inference; the same batch evaluated twice gives the
same output; DataLoader workers draw different random numbers; autocast computes in its low dtype; a
loss compares each sample with its own target; a batch keeps its batch dimension on its way to the model;
DDP replicas stay identical.
"""

from __future__ import annotations

from typing import Any

from trainguard.findings import MODEL, PREFLIGHT, PROBE, Finding
from trainguard.rules.rule import Rule, fmt


def name_list(values: list[str] | None, more: int | None = None) -> str:
    values = list(values or [])
    text = ", ".join(values[:5])
    extra = (more or len(values)) - min(5, len(values))
    return text + (f" (+{extra} more)" if extra > 0 else "")


def fmt_steps(steps: list[int]) -> str:
    return ", ".join(str(s) for s in steps[:5]) + (" ..." if len(steps) > 5 else "")


class ContractRule(Rule):
    """A rule fed by one kind of contract event: `make(event)` formats the finding."""

    def on_event(self, event: dict[str, Any]) -> Finding | None:
        if event.get("kind") != "contract" or event.get("name") != self.name:
            return None
        return self.make(event.get("data") or {}, event.get("step"))

    def make(self, data: dict[str, Any], step: int | None) -> Finding | None:
        raise NotImplementedError


class StepUpdatesNothing(ContractRule):
    """TG211 step-updates-nothing: optimizer steps run while no parameter in the optimizer has a gradient.

    ## What it detects
    Two optimizer steps in a row at which none of the optimizer's parameters has a gradient: every
    one is frozen (`requires_grad=False`) or outside the loss's graph, so `optimizer.step()` skips them
    all and changes nothing. The probe reads `p.grad is None` at each step: no device work.

    ## Why it matters
    The loop, the loss and the logs look like training, and nothing learns. The usual causes: the
    whole model frozen for fine-tuning, head included (discuss.pytorch.org/t/84911, reproduced by
    TrainCheck); `loss.requires_grad = True` added to silence "element 0 of tensors does not require grad"
    (ronghuaiyang/arcface-pytorch#56), which
    makes `backward()` run on a loss detached from the model; `zero_grad()` called between `backward()`
    and `step()`.

    ## Example
    `TG211 step-updates-nothing [error] at step 1: optimizer steps 1, 2 ran with no gradient on any of
    its 4 parameter tensors (4 frozen: fc1.weight, fc1.bias, fc2.weight, fc2.bias): the steps change nothing`

    ## What to change
    Unfreeze what should learn (`requires_grad_(True)`, build the optimizer from the parameters that
    require grad); never set `requires_grad` on the loss: compute it from the model's output; call
    `zero_grad()` before `backward()`, not between `backward()` and `step()`.

    ## Known false positives
    A loop that deliberately steps an optimizer whose parameters get no gradient at those steps (an
    alternating schedule with a second optimizer that holds the learning parameters).

    ## Options
    None.
    """

    code, name, severity = "TG211", "step-updates-nothing", "error"
    needs = (PROBE,)
    status = "preview"

    def make(self, data: dict[str, Any], step: int | None) -> Finding:
        steps = data.get("steps") or [step]
        frozen = data.get("frozen") or 0
        why = (f"{frozen} frozen: {name_list(data.get('frozen_names'), frozen)}" if frozen
               else "all require grad, none is in the loss's graph")
        cause = "all-frozen" if frozen and frozen == data.get("params_in_optimizer") else (
            "no-grad" if not frozen else "frozen-and-detached")
        return self.finding(
            step=steps[0],
            summary=f"optimizer steps {', '.join(str(s) for s in steps[:5])} ran with no gradient on any of its "
                    f"{data.get('params_in_optimizer')} parameter tensors ({why}): the steps change nothing",
            fix="unfreeze what should learn and build the optimizer from it; compute the loss from the model's "
                "output (never set loss.requires_grad); call zero_grad() before backward(), not before step()",
            evidence={**data, "detected_step": steps[-1]}, cause=cause,
        )


class FrozenParamsUpdated(ContractRule):
    """TG212 frozen-params-updated: an optimizer step changed parameters with `requires_grad=False`.

    ## What it detects
    At each step the probe looks for frozen parameters the optimizer still holds with a gradient tensor
    (a stale one, zeroed rather than set to None); when there are some, a sample of each is compared
    before and after `optimizer.step()` and any that changed is reported with the share of its elements
    that moved. The comparison runs on the device and is read back without a sync.

    ## Why it matters
    Freezing by `requires_grad_(False)` stops new gradients, not the optimizer: with a zeroed gradient
    still attached, weight decay (AdamW, SGD's `weight_decay`) and momentum keep moving the weights the
    user froze, so a "frozen" backbone drifts. The forum threads on layers that still change after
    `requires_grad=False` (e.g. discuss.pytorch.org/t/153740 "Why there is still a small change in frozen
    layer parameters?") are this bug.

    ## Example
    `TG212 frozen-params-updated [error] at step 31: optimizer step 31 changed 2 frozen parameter tensors
    (requires_grad=False): backbone.0.weight (100% of elements), backbone.0.bias (100%)`

    ## What to change
    Take frozen parameters out of the optimizer (build it from `filter(lambda p: p.requires_grad, ...)`,
    or a new param group list), or set their `.grad = None` when freezing (`zero_grad(set_to_none=True)`,
    the default since PyTorch 2.0).

    ## Known false positives
    None known: a tensor with `requires_grad=False` that an optimizer changes is not frozen.

    ## Options
    None.
    """

    code, name, severity = "TG212", "frozen-params-updated", "error"
    needs = (PROBE,)
    status = "preview"

    def make(self, data: dict[str, Any], step: int | None) -> Finding:
        share = data.get("changed_share") or {}
        listed = ", ".join(f"{n} ({fmt(100 * v)}% of elements)" for n, v in list(share.items())[:5])
        return self.finding(
            step=step,
            summary=f"optimizer step {step} changed {data.get('count')} frozen parameter tensors "
                    f"(requires_grad=False) through {data.get('optimizer')}: {listed}",
            fix="build the optimizer from the parameters that require grad only, or set p.grad = None when "
                "freezing (zero_grad(set_to_none=True)): weight decay and momentum move a stale gradient",
            evidence={**data, "detected_step": step}, cause="stale-grad",
        )


class GradsNeverReset(ContractRule):
    """TG213 grads-never-reset: gradients keep accumulating across optimizer steps.

    ## What it detects
    The probe follows the gradient of one parameter (the largest trainable one; another once backward
    passes stop reaching it): each optimizer step records the gradient it leaves and its version counter,
    and a tensor hook sees `.grad` just before each backward pass adds to it. If between two optimizer
    steps backward passes added to a gradient that nothing reset (not set to None, not replaced, not
    zeroed), the step used the sum of this window's gradients and every earlier one. Two such windows
    make the finding. No device work.

    ## Why it matters
    `loss.backward()` adds to `.grad`; only `zero_grad()` on the optimizer (or model) that holds these
    parameters resets it. Without it (or with `zero_grad()` on another model or optimizer, as in a GAN
    loop that zeroes D's gradients twice and G's never) each step follows the running sum of all past
    gradients: far larger steps than the LR says, in a stale direction. Called "the most common PyTorch
    bug" by many a tutorial; TrainCheck infers the same contract from reference runs (its invariants for
    Stack Overflow question 60335387, "Missing call to `optimizer.zero_grad`": `zero_grad` co-occurs with
    `backward`, `parameter.grad` is periodically None).

    ## Example
    `TG213 grads-never-reset [error] at step 2: the gradient of fc.weight was not reset between optimizer
    steps 2, 3 (grad_accum 1): it holds the sum of at least 3 backward passes`

    ## What to change
    Call `optimizer.zero_grad()` (on the optimizer that holds these parameters) once per optimizer step,
    after `optimizer.step()` or before the step's first `backward()`.

    ## Known false positives
    A loop that deliberately steps the optimizer several times on one accumulated gradient.

    ## Options
    None.
    """

    code, name, severity = "TG213", "grads-never-reset", "error"
    needs = (PROBE,)
    status = "preview"

    def make(self, data: dict[str, Any], step: int | None) -> Finding:
        steps = data.get("steps") or [step]
        return self.finding(
            step=steps[0],
            summary=f"the gradient of {data.get('param')} was not reset between optimizer steps "
                    f"{', '.join(str(s) for s in steps[:5])} (grad_accum {data.get('grad_accum')}): it holds the sum "
                    f"of at least {data.get('backward_passes')} backward passes",
            fix="call optimizer.zero_grad() on the optimizer that holds these parameters once per optimizer step "
                "(after step(), or before the step's first backward())",
            evidence={**data, "detected_step": steps[-1]}, cause="no-zero-grad",
        )


class EvalInTrainMode(ContractRule):
    """TG214 eval-in-train-mode: the model is evaluated in training mode (dropout on, batch norm updating).

    ## What it detects
    A forward of the watched model with `model.training` True while gradients are off, inside a
    `guard.phase("eval")` (or "val", "test") or for three forwards in a row under `torch.no_grad()`,
    when the model holds layers that behave differently in training mode (dropout with p > 0, batch norm
    tracking running statistics, a multi-layer RNN with dropout) and those are in training mode.

    ## Why it matters
    In training mode dropout drops activations and batch norm normalises with the batch's statistics
    and updates its running ones with the evaluation data: the evaluation numbers are noisy and wrong,
    and the model the evaluation leaves behind has been changed by it. `model.eval()` forgotten before
    the evaluation loop (or `model.train()` called inside it) is the usual cause.

    ## Example
    `TG214 eval-in-train-mode [warning] at step 50: Net was evaluated in training mode (phase eval): 2
    layers still train: dropout (Dropout), bn1 (BatchNorm1d)`

    ## What to change
    Call `model.eval()` before evaluating and `model.train()` after; under `torch.no_grad()` or
    `torch.inference_mode()` the mode still has to be switched.

    ## Known false positives
    Monte-Carlo dropout on purpose, or targets computed with the training model under `no_grad`
    for three forwards in a row outside an eval phase.

    ## Options
    None.
    """

    code, name, severity = "TG214", "eval-in-train-mode", "warning"
    needs = (MODEL,)
    status = "preview"

    def make(self, data: dict[str, Any], step: int | None) -> Finding:
        where = f"phase {data['phase']}" if data.get("phase") else f"{data.get('forwards')} forwards in a row under no_grad"
        return self.finding(
            step=step,
            summary=f"{data.get('model')} was evaluated in training mode ({where}): {data.get('module_count')} layers "
                    f"still train: {name_list(data.get('modules'), data.get('module_count'))}",
            fix="call model.eval() before evaluating and model.train() after it (no_grad does not switch the mode)",
            evidence={**data, "detected_step": step}, cause="no-model-eval",
        )


class EvalBeforeTrainInit(ContractRule):
    """TG215 eval-before-train-init: evaluation after training steps, with no training-mode forward ever run.

    ## What it detects
    A forward of the watched model in eval mode after optimizer steps (an evaluation, or the training
    forward itself), when no forward in training mode was ever seen and the model's batch-norm layers
    still count zero batches tracked: their running statistics are the initial ones (mean 0, variance 1).

    ## Why it matters
    Some state is only initialised or updated by a forward in training mode: batch norm's running
    statistics, spectral norm's power iteration (pytorch/pytorch#51800). A model trained while left in
    eval mode (`model.eval()` once at start-up and `model.train()` never called; the same slip as
    pytorch/tutorials#1540, where `test()` called `model.eval()` and every later epoch trained in eval
    mode) normalises with statistics it never learned, and the evaluation says so only as bad numbers.

    ## Example
    `TG215 eval-before-train-init [warning] at step 1: Net ran in eval mode after 1 optimizer steps and never
    ran a forward in training mode: 2 batch-norm layers still hold their initial statistics: body.1, body.4`

    ## What to change
    Call `model.train()` before the training loop (and after each evaluation).

    ## Known false positives
    Training in eval mode on purpose with batch-norm layers that were never meant to be used.

    ## Options
    None.
    """

    code, name, severity = "TG215", "eval-before-train-init", "warning"
    needs = (MODEL,)
    status = "preview"

    def make(self, data: dict[str, Any], step: int | None) -> Finding:
        return self.finding(
            step=step,
            summary=f"{data.get('model')} ran in eval mode after {data.get('steps_trained')} optimizer steps and never "
                    f"ran a forward in training mode: {data.get('module_count')} batch-norm layers still hold their "
                    f"initial statistics: {name_list(data.get('modules'), data.get('module_count'))}",
            fix="call model.train() before the training loop and after each evaluation",
            evidence={**data, "detected_step": step}, cause="never-train-mode",
        )


class EvalNotDeterministic(ContractRule):
    """TG216 eval-not-deterministic: the same batch evaluated twice gives different outputs (preflight).

    ## What it detects
    Under `trainguard preflight`, the first eval-mode forwards of the watched model under `no_grad` are
    run a second time on the same inputs; outputs that differ by more than 0.1% of their largest value
    are reported with the first differing element of each run.

    ## Why it matters
    In eval mode a model is a function: randomness left in it (`F.dropout(x, p)`, whose `training`
    argument defaults to True; noise added without checking `self.training`; sampling in the forward)
    makes every evaluation a different draw, so checkpoints are chosen and early stopping fires on noise.

    ## Example
    `TG216 eval-not-deterministic [warning]: Net gave two different outputs for the same batch in eval mode:
    element 3 of output 0 (shape [64, 10]) was 0.1234 then 0.5321; 310 of 640 elements differ`

    ## What to change
    Pass `training=self.training` to functional dropout (or use `nn.Dropout`), and gate any other noise
    on `self.training`.

    ## Known false positives
    A model that samples on purpose at evaluation (a VAE's sampled latent, a generative model's
    decoding), or keeps a cache it updates in the forward.

    ## Options
    None; runs only in preflight.
    """

    code, name, severity = "TG216", "eval-not-deterministic", "warning"
    needs = (MODEL, PREFLIGHT)  # it runs only under preflight's fast-forward
    status = "preview"

    def make(self, data: dict[str, Any], step: int | None) -> Finding:
        if "first_shape" in data:
            what = f"output {data.get('output')} had shape {data['first_shape']} then {data.get('second_shape')}"
        else:
            what = (f"element {data.get('index')} of output {data.get('output')} (shape {data.get('shape')}) was "
                    f"{fmt(data.get('first'))} then {fmt(data.get('second'))}; {data.get('differing')} of "
                    f"{data.get('elements')} elements differ")
        return self.finding(
            step=step,
            summary=f"{data.get('model')} gave two different outputs for the same batch in eval mode: {what}",
            fix="pass training=self.training to functional dropout (or use nn.Dropout) and gate other noise on "
                "self.training",
            evidence={**data}, cause="random-in-eval",
        )


class TrainInEvalMode(ContractRule):
    """TG217 train-in-eval-mode: after an evaluation, training went on with the model left in eval mode.

    ## What it detects
    Optimizer steps whose forwards of the watched model all ran in eval mode with gradients on, three
    steps in a row, after the same model had trained in training mode: `model.eval()` for an evaluation
    and no `model.train()` after it. Judged only for a model holding layers that behave differently in
    the two modes (dropout with p > 0, batch norm tracking running statistics, a multi-layer RNN with
    dropout). Under `trainguard run` with no code change, the model is the one the stepped optimizer
    trains, found through torch's global module hooks.

    ## Why it matters
    Every step after the first evaluation trains without dropout and with batch norm frozen at its
    running statistics: the regularisation the model was designed with is gone, and nothing fails. The
    pattern of pytorch/tutorials#1624 (the quickstart's `test()` calls `model.eval()`, `train()` never
    calls `model.train()`, so every epoch after the first trains in eval mode), tk-rusch/coRNN#1 and
    wkentaro/pytorch-fcn#56 (a validation in the middle of an epoch leaves the rest of it in eval mode).

    ## Example
    `TG217 train-in-eval-mode [warning] at step 33: Net trained in eval mode at optimizer steps 33, 34, 35
    after training in training mode until step 32: 2 layers do not train: dropout (Dropout), bn1
    (BatchNorm1d)`

    ## What to change
    Call `model.train()` at the start of each training epoch (or right after each evaluation), not once
    before the loop.

    ## Known false positives
    Freezing batch norm on purpose by `model.eval()` part-way through training (fine-tuning): set the
    batch-norm layers' own mode (`m.eval()` on those layers) to make the intent explicit.

    ## Options
    None.
    """

    code, name, severity = "TG217", "train-in-eval-mode", "warning"
    needs = (MODEL,)
    status = "preview"

    def make(self, data: dict[str, Any], step: int | None) -> Finding:
        steps = data.get("steps") or []
        return self.finding(
            step=step,
            summary=f"{data.get('model')} trained in eval mode at optimizer steps {fmt_steps(steps)} after training "
                    f"in training mode until step {data.get('last_train_step')}: {data.get('module_count')} layers do "
                    f"not train: {name_list(data.get('modules'), data.get('module_count'))}",
            fix="call model.train() at the start of each training epoch (or right after each evaluation), not once "
                "before the loop",
            evidence={**data, "detected_step": steps[-1] if steps else step}, cause="no-model-train-after-eval",
        )
