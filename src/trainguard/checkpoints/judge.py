"""A verified checkpoint's verdict, from its facts (checkpoints/read.py) and what the run knew when it saved.

    verdict(facts, at_step=500, previous=last_verified, learning=True) -> ("poisoned", "...")

The verdicts, most serious first:
- `unloadable`: the loader failed (a truncated file, a missing shard, a damaged archive);
- `poisoned`: a tensor holds NaN or Inf;
- `step-mismatch`: the checkpoint says it was saved at an older step than the run was at when it reported
  it (a stale state dict saved again, a copy taken long ago). Only an *older* claim counts: a script's own
  counter that runs ahead of the probe's (a resumed run that did not call `guard.set_step`) is no proof;
- `unchanged`: the same numbers as the previous verified checkpoint of the same series although the run
  trained between them (the saved object is not the model being trained);
- `unverified`: it could not be judged (a format trainguard does not read, objects weights_only refuses,
  the verifier ran out of time or memory): nothing is claimed either way;
- `verified`: loads, every tensor finite, the step it claims agrees.

A series is a path with its digits masked: checkpoint-100 and checkpoint-200 are one series, best.pt its
own. A checkpoint named "best" is left out of the step and unchanged checks: it is rewritten only when the
metric improves, so an old step and the same numbers are what it should hold.
"""

from __future__ import annotations

import re
from typing import Any

FAILED = ("unloadable", "poisoned", "step-mismatch", "unchanged")
STEP_SLACK = 1  # steps a claim may trail the probe's count (a script that saves before counting the step)


def series(path: str) -> str:
    """The path with its numbers masked: the checkpoints one save site writes over a run."""
    return re.sub(r"\d+", "#", path)


def exempt(path: str) -> bool:
    """A checkpoint that keeps the best model so far: legitimately old and legitimately unchanged."""
    return "best" in path.rsplit("/", 1)[-1].lower()


def _by_design(entry: dict[str, Any], nan_only: bool) -> bool:
    """A non-finite tensor that is so on purpose: Inf without NaN in a mask buffer (a causal mask filled with
    -inf), or in a single-value tensor (a best-score tracker's starting +-inf: Lightning's ModelCheckpoint
    keeps `kth_value = inf` until a score is better); in a file nobody reported, any Inf without NaN (saved
    log-probabilities, masks)."""
    if entry.get("nan"):
        return False
    return nan_only or entry.get("numel") == 1 or "mask" in str(entry.get("tensor", "")).lower()


def verdict(facts: dict[str, Any], *, at_step: int | None, previous: dict[str, Any] | None,
            learning: bool = True, step_checked: bool = True) -> tuple[str, str]:
    """(status, one sentence why). `previous` is the last verified check of the same series (its data)."""
    path = str(facts.get("path") or "")
    if facts.get("error"):
        return "unloadable", f"it does not load: {facts['error']}"
    if facts.get("unverifiable"):
        return "unverified", str(facts["unverifiable"])
    bad = facts.get("nonfinite_tensors") or 0
    listed = facts.get("nonfinite") or []
    if bad and len(listed) >= bad and all(_by_design(e, nan_only=not step_checked) for e in listed):
        bad = 0  # only -inf masks (or, in a file nobody reported, Inf without NaN): non-finite by design
    if bad:
        first = (facts.get("nonfinite") or [{}])[0]
        return "poisoned", (f"{bad} of its {facts.get('tensors')} tensors hold non-finite values "
                            f"({facts.get('nonfinite_elements')} elements; the first, {first.get('tensor')}, "
                            f"{first.get('nonfinite')} of {first.get('numel')})")
    if not facts.get("tensors"):
        return "unverified", "it holds no tensors"
    claimed = facts.get("claimed_step")
    if (step_checked and not exempt(path) and isinstance(claimed, int) and isinstance(at_step, int)
            and claimed < at_step - STEP_SLACK):
        return "step-mismatch", (f"it says step {claimed} ({facts.get('claimed_from')}) but the run was at step "
                                 f"{at_step} when it was saved: {at_step - claimed} steps stale")
    if (previous is not None and learning and not exempt(path) and facts.get("fingerprint")
            and previous.get("fingerprint") == facts.get("fingerprint")
            and isinstance(at_step, int) and isinstance(previous.get("at_step"), int)
            and at_step > previous["at_step"]):
        return "unchanged", (f"its numbers are identical to {previous.get('path')} (step {previous['at_step']}) "
                             f"although the run trained {at_step - previous['at_step']} steps between them")
    return "verified", (f"{facts.get('tensors')} tensors, {facts.get('elements'):,} values, all finite"
                        + (f"; step {claimed} ({facts.get('claimed_from')})" if isinstance(claimed, int) else ""))
