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

import collections
from typing import Any

from trainguard.findings import MODEL, MODEL_LOSS, PREFLIGHT, PROBE, RANKS, STEPS, Finding
from trainguard.rules.rule import Rule, fmt


def _names(values: list[str] | None, more: int | None = None) -> str:
    values = list(values or [])
    text = ", ".join(values[:5])
    extra = (more or len(values)) - min(5, len(values))
    return text + (f" (+{extra} more)" if extra > 0 else "")


class _ContractRule(Rule):
    """A rule fed by one kind of contract event: `make(event)` formats the finding."""

    def on_event(self, event: dict[str, Any]) -> Finding | None:
        if event.get("kind") != "contract" or event.get("name") != self.name:
            return None
        return self.make(event.get("data") or {}, event.get("step"))

    def make(self, data: dict[str, Any], step: int | None) -> Finding | None:
        raise NotImplementedError


class StepUpdatesNothing(_ContractRule):
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
        why = (f"{frozen} frozen: {_names(data.get('frozen_names'), frozen)}" if frozen
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


class FrozenParamsUpdated(_ContractRule):
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


class GradsNeverReset(_ContractRule):
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


class EvalInTrainMode(_ContractRule):
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
                    f"still train: {_names(data.get('modules'), data.get('module_count'))}",
            fix="call model.eval() before evaluating and model.train() after it (no_grad does not switch the mode)",
            evidence={**data, "detected_step": step}, cause="no-model-eval",
        )


class EvalBeforeTrainInit(_ContractRule):
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
                    f"initial statistics: {_names(data.get('modules'), data.get('module_count'))}",
            fix="call model.train() before the training loop and after each evaluation",
            evidence={**data, "detected_step": step}, cause="never-train-mode",
        )


class EvalNotDeterministic(_ContractRule):
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


class TrainInEvalMode(_ContractRule):
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
                    f"not train: {_names(data.get('modules'), data.get('module_count'))}",
            fix="call model.train() at the start of each training epoch (or right after each evaluation), not once "
                "before the loop",
            evidence={**data, "detected_step": steps[-1] if steps else step}, cause="no-model-train-after-eval",
        )


def fmt_steps(steps: list[int]) -> str:
    return ", ".join(str(s) for s in steps[:5]) + (" ..." if len(steps) > 5 else "")


class AutocastRunsFp32(_ContractRule):
    """TG311 autocast-runs-fp32: the model's largest layers compute in float32 inside what should be autocast.

    ## What it detects
    On sampled training forwards: an autocast region enabled for another device than the model's (a
    `torch.autocast("cuda")` around a model on the CPU, or the reverse), or autocast enabled for the
    model's device while more than half of the weights of its largest Linear/Conv layers produce float32
    outputs (autocast disabled inside the model), or, on CUDA, an enabled GradScaler given to
    `trainguard.watch` while three sampled forwards in a row of an fp32 model run without autocast
    (a GradScaler on the CPU is left alone: there it is a deliberate choice, not a sign of fp16).
    Only dtypes are read: no device work.

    ## Why it matters
    Autocast does nothing where it does not reach: the run pays for mixed precision (a GradScaler, the
    expectation of bf16 speed and memory) and computes in fp32, silently slower and larger.
    Lightning-AI/lightning-thunder#725 was such a regression: Thunder applied autocast to torch symbols
    only, so `prims.linear` inside `torch.autocast` ran in fp32 (TrainCheck lists it, with an invariant
    it could not check on jit-transformed programs).

    ## Example
    `TG311 autocast-runs-fp32 [warning] at step 1: autocast is on for cuda but the model is on cpu: its
    layers compute in float32 (fc1, fc2)`

    ## What to change
    Use `torch.autocast(device_type=<the model's device>)` around the forward and the loss; remove the
    `enabled=False` region (or `.float()` casts) inside the model; keep fp32 only for small, sensitive
    layers (a router, a final norm).

    ## Known false positives
    Models that keep most of their large layers in fp32 on purpose.

    ## Options
    `trainguard.watch(stats_every=N)` sets how often forwards are sampled.
    """

    code, name, severity = "TG311", "autocast-runs-fp32", "warning"
    needs = (MODEL,)
    status = "preview"

    def make(self, data: dict[str, Any], step: int | None) -> Finding:
        cause = data.get("cause")
        layers = _names(data.get("layers"))
        if cause == "other-device":
            summary = (f"autocast is on for {data.get('autocast_device')} but the model is on "
                       f"{data.get('model_device')}: its layers compute in float32 ({layers})")
        elif cause == "no-autocast":
            summary = (f"a {data.get('scaler')} is in use but sampled forwards (steps "
                       f"{', '.join(str(s) for s in (data.get('steps') or [])[:5])}) ran without autocast: the model "
                       f"computes in float32 ({layers})")
        else:
            summary = (f"autocast ({data.get('autocast_dtype')}) is on, but {fmt(100 * (data.get('fp32_share') or 0))}% "
                       f"of the largest layers' weights compute in float32: {layers}")
        return self.finding(
            step=step, summary=summary,
            fix="wrap the forward and the loss in torch.autocast(device_type=<the model's device>); remove "
                "enabled=False regions or .float() casts inside the model",
            evidence={**data, "detected_step": step}, cause=cause,
        )


class WorkersShareRng(_ContractRule):
    """TG541 workers-share-rng: DataLoader workers (or epochs) start from the same random state.

    ## What it detects
    The probe chains the loader's `worker_init_fn` (for loaders read through `guard.batches`, first
    few epochs). Each worker records a fingerprint of every generator its dataset's per-sample code
    uses (a NumPy Generator or RandomState, a `random.Random`, a `torch.Generator` held by the dataset
    or its transforms; the global NumPy and `random` generators if the code calls them) and the next
    three numbers each would draw. Two workers, or the same worker in two epochs, starting from the same
    state draw the same numbers.

    ## Why it matters
    Every worker then applies the same "random" crops, flips and noise, and with workers that are
    restarted each epoch every epoch repeats them: the augmentation the run pays for is a fraction of
    what it looks like. pytorch/pytorch#5059 ("np.random generates the same random numbers for each data
    batch") is the bug for the global NumPy generator; pytorch/pytorch#56488 ("Fixes #5059") made the
    DataLoader seed that generator in each worker, as `torch/utils/data/_utils/worker.py` does today.
    A generator the dataset owns is not reseeded (wolny/pytorch-3dunet#32: "the workers share the common
    instance of the `Dataset` which was initialized with a fixed seed"), nor is anything a
    `worker_init_fn` seeds with a constant.

    ## Example
    `TG541 workers-share-rng [warning]: workers 0 and 1 (epoch 1) start dataset.rng (Generator) in the
    same state: both draw 0.637, 0.27, 0.0409 first`

    ## What to change
    Seed the dataset's generator per worker in `worker_init_fn` from `torch.utils.data.get_worker_info().seed`
    (which changes each epoch), or draw the randomness from `torch` (seeded per worker by PyTorch).

    ## Known false positives
    A generator that is meant to give every worker the same sequence (a fixed, shared validation
    perturbation).

    ## Options
    None.
    """

    code, name, severity = "TG541", "workers-share-rng", "warning"
    needs = (STEPS,)
    status = "preview"

    def make(self, data: dict[str, Any], step: int | None) -> Finding:
        a, b = data.get("first") or {}, data.get("second") or {}
        draws = ", ".join(fmt(v) for v in (a.get("draws") or []))
        if data.get("across") == "workers":
            who = f"workers {a.get('worker')} and {b.get('worker')} (epoch {a.get('epoch')})"
        else:
            who = f"worker {a.get('worker')} in epoch {a.get('epoch')} and worker {b.get('worker')} in epoch {b.get('epoch')}"
        return self.finding(
            step=step,
            summary=f"{who} start {data.get('generator')} ({data.get('type')}) in the same state: both draw {draws} first",
            fix="seed the dataset's generator per worker in worker_init_fn from torch.utils.data.get_worker_info().seed, "
                "or draw the randomness from torch",
            evidence={**data}, cause=f"same-{data.get('across')}",
        )


class LossBroadcastsBatch(_ContractRule):
    """TG542 loss-broadcasts-batch: the loss compares every output with every target (a lost batch dimension).

    ## What it detects
    On sampled steps: the model's output of shape (B, 1) (or (B,)) and a target in the batch read
    through `guard.batches` of shape (B,) (or (B, 1)) broadcast to (B, B); the probe computes the mean
    squared error, mean absolute error and sum of squares both ways on the device and reports when the
    loss given to `guard.step` equals the broadcast one and not the aligned one.

    ## Why it matters
    `F.mse_loss(out, y)` with `out` (B, 1) and `y` (B,) is a (B, B) comparison: every prediction is
    pulled towards the batch's mean target, and the loss falls a little and stops. PyTorch only warns
    (once, often filtered); the forum threads on regressions stuck at predicting the mean ("loss not
    decreasing", "Using a target size that is different to the input size"; pytorch/pytorch#16045,
    discuss.pytorch.org/t/148155) are this bug.

    ## Example
    `TG542 loss-broadcasts-batch [error] at step 1: the loss (mse) compares an output of shape [64, 1]
    with a target of shape [64] as [64, 64]: 1.52 where the aligned loss is 0.31`

    ## What to change
    Give output and target the same shape: `out.squeeze(-1)` or `y.unsqueeze(-1)` (or `y.view_as(out)`).

    ## Known false positives
    None known: the loss is matched to the broadcast value to 4 digits.

    ## Options
    `trainguard.watch(stats_every=N)` sets how often steps are sampled.
    """

    code, name, severity = "TG542", "loss-broadcasts-batch", "error"
    needs = (MODEL_LOSS,)
    status = "preview"

    def make(self, data: dict[str, Any], step: int | None) -> Finding:
        return self.finding(
            step=step,
            summary=f"the loss ({data.get('loss_kind')}) compares an output of shape {data.get('output_shape')} with a "
                    f"target of shape {data.get('target_shape')} as {data.get('broadcast_shape')}: "
                    f"{fmt(data.get('loss'))} where the aligned loss is {fmt(data.get('loss_without_broadcast'))}",
            fix="give output and target the same shape (out.squeeze(-1), or y.view_as(out)) before the loss",
            evidence={**data, "detected_step": step}, cause="broadcast",
        )


class BatchDimLost(_ContractRule):
    """TG543 batch-dim-lost: a batch reached the model without its batch dimension (a batch of 1 squeezed).

    ## What it detects
    A training forward whose first input has one dimension fewer than on every earlier training
    forward, and whose shape is theirs without the leading (batch) dimension, or the batch read
    through `guard.batches` just before had a leading dimension of 1. The probe reads shapes on every
    training forward (the batch of 1 is typically the last of an epoch, one step in hundreds): no
    device work.

    ## Why it matters
    `x.squeeze()` meant to drop a singleton feature or channel dimension also drops the batch
    dimension when a batch holds one sample: a dataset of 1,001 rows with a batch size of 8 ends every
    epoch with one. Linear, convolution, recurrent and attention layers and `cross_entropy` all accept
    unbatched input, so nothing fails, but code that reads the batch size from `x.size(0)`, `len(x)` or
    dimension 1 now reads a feature dimension: per-sample loss sums are scaled by it, running averages
    weighted by it, and the model breaks at inference on a single sample. The reports of this squeeze
    are many, from code where a later layer happened to fail (galsang/BiDAF-pytorch#26,
    layumi/Person_reID_baseline_pytorch#77, NVIDIA/DeepLearningExamples#765: "When batch size is 1,
    `squeeze` collapses the batch dimension").

    ## Example
    `TG543 batch-dim-lost [warning] at step 126: MLP was given an input of shape [16] where its training
    inputs were [8, 16] (the loader's batch: [1, 1, 16]): the batch dimension of a batch of 1 was
    dropped on the way`

    ## What to change
    Squeeze the dimension you mean (`x.squeeze(1)`, `x.flatten(1)`, `x.view(x.size(0), -1)`) rather than
    every dimension of size 1; or drop the incomplete last batch (`DataLoader(drop_last=True)`).

    ## Known false positives
    A model deliberately fed single unbatched samples with gradients on, after batched ones, in training
    mode.

    ## Options
    None.
    """

    code, name, severity = "TG543", "batch-dim-lost", "warning"
    needs = (MODEL,)
    status = "preview"

    def make(self, data: dict[str, Any], step: int | None) -> Finding:
        loader = data.get("loader_shape")
        seen = f" (the loader's batch: {loader})" if loader else ""
        return self.finding(
            step=step,
            summary=f"{data.get('model', 'the model')} was given an input of shape {data.get('input_shape')} where "
                    f"its training inputs were {data.get('usual_shape')}{seen}: the batch dimension of a batch of 1 "
                    f"was dropped on the way",
            fix="squeeze the dimension you mean (x.squeeze(1), x.flatten(1)) rather than every dimension of size 1, "
                "or drop the incomplete last batch (DataLoader(drop_last=True))",
            evidence={**data, "detected_step": step}, cause="squeezed",
        )


class ReplicasDiverged(Rule):
    """TG701 replicas-diverged: data-parallel replicas hold different parameters after the same step.

    ## What it detects
    When the watched model is a `DistributedDataParallel` and `WORLD_SIZE` > 1, each rank's probe
    records, on sampled steps, a float64 checksum of a strided sample of up to 8 parameter tensors (the
    first and the largest), computed on the device and read back without a sync. This rule compares the ranks' checksums for the same step: DDP keeps replicas
    bitwise identical, so any difference beyond 1e-9 relative means they drifted apart.

    ## Why it matters
    Replicas that drift train different models: the checkpoint (rank 0's) is not what the other ranks
    evaluated, and the gradients averaged are of different models. Causes: a forward on the unwrapped
    module (`model.module(x)` or the model before wrapping: no gradient all-reduce), the model moved to
    another device after wrapping (pytorch/pytorch#104336: DDP's autograd hooks stay on the tensors
    that moved away, so gradient synchronisation stops), clipping or a
    learning rate that depends on the rank, a rank that skips steps. BLOOM-176B's training saw such a drift.

    ## Example
    `TG701 replicas-diverged [error] at step 1: ranks 0 and 1 hold different parameters after step 1:
    fc1.weight sums to 1.2345 on rank 0 and 1.2401 on rank 1`

    ## What to change
    Call the DDP-wrapped model for the forward; wrap after moving the model to its device; keep
    clipping, LR and step decisions identical on every rank.

    ## Known false positives
    None known: only a DDP model is checked (FSDP, ZeRO and tensor parallelism shard parameters under
    the same names, so their ranks are not compared). A replica check of a model not wrapped in DDP is
    not made at all.

    ## Options
    Runs only where the ranks write one run folder (`trainguard run`, or `diagnose` afterwards).
    """

    code, name, severity = "TG701", "replicas-diverged", "error"
    needs = (RANKS,)
    status = "preview"
    all_ranks = True  # the engine gives this rule every rank's events (it compares them)
    KEEP_STEPS = 16

    def __init__(self, plan: dict[str, Any]) -> None:
        super().__init__(plan)
        self.by_step: collections.OrderedDict[int, dict[int, dict[str, Any]]] = collections.OrderedDict()

    def on_event(self, event: dict[str, Any]) -> Finding | None:
        if event.get("kind") != "contract" or event.get("name") != "param-checksum":
            return None
        data = event.get("data") or {}
        step, rank = event.get("step"), data.get("rank", event.get("rank"))
        if step is None or rank is None:
            return None
        ranks = self.by_step.setdefault(step, {})
        ranks[rank] = data
        while len(self.by_step) > self.KEEP_STEPS:
            self.by_step.popitem(last=False)
        if len(ranks) < 2:
            return None
        base_rank = min(ranks)
        base = ranks[base_rank]
        for other_rank, other in sorted(ranks.items()):
            if other_rank == base_rank or other.get("names") != base.get("names"):
                continue
            for name, a, b in zip(base.get("names") or [], base.get("sums") or [], other.get("sums") or []):
                if abs(a - b) > 1e-9 * max(abs(a), abs(b), 1e-12):
                    return self.finding(
                        step=step,
                        summary=f"ranks {base_rank} and {other_rank} hold different parameters after step {step}: "
                                f"{name} sums to {a!r} on rank {base_rank} and {b!r} on rank {other_rank}",
                        fix="call the DDP-wrapped model for the forward, wrap after moving the model to its device, "
                            "and keep clipping, LR and step decisions identical on every rank",
                        evidence={"step": step, "param": name, "ranks": [base_rank, other_rank],
                                  "checksums": {str(base_rank): a, str(other_rank): b},
                                  "detected_step": step}, cause="drift",
                    )
        return None
