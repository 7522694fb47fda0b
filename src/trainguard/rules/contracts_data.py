"""API contracts on what flows through the step: autocast, the workers' RNG, batch shapes, DDP replicas
(the probe's checks in probe/contract_*.py report them)."""


from __future__ import annotations

import collections
from typing import Any

from trainguard.findings import MODEL, MODEL_LOSS, RANKS, STEPS, Finding
from trainguard.rules.contracts import ContractRule, name_list
from trainguard.rules.rule import Rule, fmt


class AutocastRunsFp32(ContractRule):
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
        layers = name_list(data.get("layers"))
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


class WorkersShareRng(ContractRule):
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


class LossBroadcastsBatch(ContractRule):
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


class BatchDimLost(ContractRule):
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
