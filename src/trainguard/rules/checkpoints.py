"""TG56x: checkpoints that a restart or a release must not rely on, from their verification (issue 37).

The verifier (checkpoints/verifier.py) reads each checkpoint the run reports, in a low-priority process of
its own, and records a `checkpoint-check` event with its verdict (checkpoints/judge.py). These rules turn
a failed verdict into an error at once, naming the checkpoint, the numbers and the last verified one to
restart from. The same events feed them live and in `trainguard diagnose RUN`.
"""

from __future__ import annotations

from typing import Any

from trainguard.contract import EVENT_CHECKPOINT_CHECK
from trainguard.findings import CHECKPOINT_CHECKS, Finding
from trainguard.rules.rule import Rule


class _CheckpointRule(Rule):
    """The shared part: each rule fires on one verdict; all keep the last verified checkpoint."""

    status_name = ""
    severity = "error"
    needs = (CHECKPOINT_CHECKS,)

    def __init__(self, plan: dict[str, Any]) -> None:
        super().__init__(plan)
        self.last_ok: dict[str, Any] | None = None

    def on_event(self, event: dict[str, Any]) -> Finding | None:
        if event.get("kind") != EVENT_CHECKPOINT_CHECK or not isinstance(event.get("data"), dict):
            return None
        d = event["data"]
        if d.get("status") == "verified":
            self.last_ok = d
            return None
        if d.get("status") != self.status_name:
            return None
        return self.finding(step=event.get("step"), summary=self.summary(d), fix=self._fix(d),
                            evidence=self.evidence(d), cause=str(d.get("path") or ""))

    def summary(self, d: dict[str, Any]) -> str:
        return f"checkpoint {d.get('path')}: {d.get('why')}"

    def evidence(self, d: dict[str, Any]) -> dict[str, Any]:
        keep = ("path", "at_step", "claimed_step", "claimed_from", "tensors", "elements", "nonfinite",
                "nonfinite_tensors", "nonfinite_elements", "error", "previous", "format", "rank", "wall_s")
        out = {k: d[k] for k in keep if d.get(k) not in (None, [], "")}
        out["last_verified"] = self._last_path(d)
        return out

    def _last_path(self, d: dict[str, Any]) -> str | None:
        return (self.last_ok or {}).get("path") or d.get("last_verified")

    def _fix(self, d: dict[str, Any]) -> str:
        last = self._last_path(d)
        where = (f"restart from the last verified checkpoint, {last}" if last else
                 "no earlier checkpoint of this run was verified: restart from the start or an older one you trust")
        return f"{self.action} Do not resume or publish {d.get('path')}; {where}."

    action = ""


class CheckpointPoisoned(_CheckpointRule):
    """TG561 checkpoint-poisoned: a checkpoint the run saved holds NaN or Inf.

    ## What it detects
    The verifier loaded a reported checkpoint (or one the watchdog saw written) and at
    least one floating tensor holds a non-finite value.

    ## Why it matters
    A run that resumes from it trains on NaN from its first step; a release of it ships
    a broken model, recorded as a success (marin#9051: a checkpoint poisoned by NaN, published).

    ## Example
    `TG561 checkpoint-poisoned [error] at step 40: checkpoint ckpt/step-40.pt: 1 of its 4 tensors
    hold non-finite values (3 elements; the first, model.0.weight, 3 of 4096)`.

    ## What to change
    Find where the numbers went bad (the run's non-finite loss or gradient findings, the
    step the loss spiked) and restart from the last verified checkpoint the finding names, with that
    cause fixed (lower LR, clipping, a loss scale, the bad batch skipped).

    ## Known false positives
    A tensor that holds Inf on purpose is non-finite by design: Inf without NaN in a tensor whose name
    says "mask" is left out (a causal mask filled with -inf); elsewhere, save such a tensor as a bool mask.

    ## Options
    None.
    """

    code, name = "TG561", "checkpoint-poisoned"
    status_name = "poisoned"
    action = "The weights (or the optimizer state) went non-finite before this save."


class CheckpointUnloadable(_CheckpointRule):
    """TG562 checkpoint-unloadable: a checkpoint the run saved does not load.

    ## What it detects
    `torch.load(weights_only=True, mmap=True)` or safetensors failed on it: a truncated
    file (the disk filled, the job was killed mid-save), a damaged archive, a shard the index names that
    is missing.

    ## Why it matters
    The restart that needs it fails hours later, when it is too late to save again.

    ## Example
    `TG562 checkpoint-unloadable [error] at step 60: checkpoint ckpt/step-60.pt: it does not load:
    RuntimeError: PytorchStreamReader failed reading zip archive: failed finding central directory`.

    ## What to change
    Check the disk (space, quota) and that the save finishes before the process exits
    (an asynchronous save joined, a barrier before exit); save to a temporary name and rename when
    complete. Restart from the last verified checkpoint.

    ## Known false positives
    None known; a checkpoint whose pickled objects `weights_only` refuses is
    recorded as unverified, not as this.

    ## Options
    None.
    """

    code, name = "TG562", "checkpoint-unloadable"
    status_name = "unloadable"
    action = "The file is incomplete or damaged."


class CheckpointStepMismatch(_CheckpointRule):
    """TG563 checkpoint-step-mismatch: a checkpoint claims an older step than the run was at when it saved it.

    ## What it detects
    The step the checkpoint names itself (its global_step/step/iter_num key,
    trainer_state.json, or the checkpoint-N in its path) is behind the run's optimizer step when the
    script reported it.

    ## Why it matters
    The save wrote a stale object (a state dict taken once and saved again, the wrong
    model of two): a restart from it silently loses the steps since, or mixes an old model with a new
    optimizer state.

    ## Example
    `TG563 checkpoint-step-mismatch [error] at step 300: checkpoint ckpt/last.pt: it says step
    100 (step) but the run was at step 300 when it was saved: 200 steps stale`.

    ## What to change
    Save the live objects (`model.state_dict()` at save time, the step counter updated
    before the save); restart from the last verified checkpoint.

    ## Known false positives
    A checkpoint named "best" is left out (it holds an older step on purpose); a
    script whose own counter lags the optimizer steps (it counts only logged steps) would trip it.

    ## Options
    None.
    """

    code, name = "TG563", "checkpoint-step-mismatch"
    status_name = "step-mismatch"
    action = "The checkpoint is not of the step it was saved at."


class CheckpointUnchanged(_CheckpointRule):
    """TG564 checkpoint-unchanged: a checkpoint holds the same numbers as the previous one though the run trained.

    ## What it detects
    Its fingerprint (each tensor's sum and sampled elements) equals that of the previous
    verified checkpoint of the same series (checkpoint-100, checkpoint-200...) while the run made
    optimizer steps between the two saves.

    ## Why it matters
    The object saved is not the model being trained (a copy made before training, an
    unwrapped module that is not the one the optimizer updates, an EMA never updated): every checkpoint is
    the same useless one.

    ## Example
    `TG564 checkpoint-unchanged [error] at step 200: checkpoint ckpt/step-200.pt: its numbers are
    identical to ckpt/step-100.pt (step 100) although the run trained 100 steps between them`.

    ## What to change
    Save the module the optimizer updates (`model.module` under DDP, the compiled model's
    `_orig_mod`), or update the copy before saving.

    ## Known false positives
    A run whose learning rate is zero, or whose trained tensors are all updated
    sparsely (rows of an embedding) in places the sample misses; `watch(learning=False)` runs are left out.

    ## Options
    None.
    """

    code, name = "TG564", "checkpoint-unchanged"
    status_name = "unchanged"
    action = "The saved object is not the model being trained."


CHECKPOINT_RULES: list[type[Rule]] = [CheckpointPoisoned, CheckpointUnloadable, CheckpointStepMismatch,
                                      CheckpointUnchanged]
