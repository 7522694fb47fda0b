"""The plan of a training config: how many optimizer steps the run makes, computed the way Hugging Face's
Trainer does it (preflight/check.py and the config rules, preflight/configrules.py, judge against it).

Micro-batches per epoch = ceil(samples / (batch size × devices)), optimizer steps per epoch = that //
gradient accumulation (at least 1), optimizer steps = max_steps when set, else steps per epoch × epochs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from trainguard.preflight.config import Config


@dataclass
class Plan:
    optimizer_steps: int | None = None
    micro_per_epoch: int | None = None
    steps_per_epoch: int | None = None
    how: str = ""
    notes: list[str] = field(default_factory=list)
    micro_batches: int | None = None
    """Micro-batches over all epochs (when the dataset size and the epochs are known)."""
    max_steps_in_micro: bool = False
    """max_steps equals the micro-batch count while accumulation > 1: the plan follows the epochs instead."""
    micro_key: str | None = None
    """The length key ("max_steps", else "sched_steps") that holds the micro-batch count (TG619)."""
    unchecked: list[str] = field(default_factory=list)
    """Checks that could not run, each with what would let them run."""


def plan_of(cfg: Config) -> Plan:
    g = cfg.get
    plan = Plan()
    accum = g("grad_accum", 1)
    if g("dataset_size") and g("batch_size") and g("batch_size") > 0 and accum > 0:
        plan.micro_per_epoch = math.ceil(g("dataset_size") / (g("batch_size") * max(1, g("world_size", 1))))
    elif g("micro_per_epoch") and g("micro_per_epoch") > 0 and accum > 0:
        plan.micro_per_epoch = g("micro_per_epoch")  # `batches_per_epoch: 25000` says it outright
    if plan.micro_per_epoch:
        plan.steps_per_epoch = max(1, plan.micro_per_epoch // accum)
    by_epochs = None
    if plan.steps_per_epoch and g("epochs") and g("epochs") > 0:
        by_epochs = max(1, math.ceil(plan.steps_per_epoch * g("epochs")))
        plan.micro_batches = math.ceil(plan.micro_per_epoch * g("epochs"))
    epochs_how = (f"{plan.micro_per_epoch} micro-batches per epoch // gradient accumulation {accum}"
                  f" × {g('epochs'):g} epochs") if by_epochs else ""
    max_steps = g("max_steps")
    if not max_steps and g("sched_steps") and by_epochs and _counts_micro(g("sched_steps"), plan.micro_batches,
                                                                         accum):
        # no max_steps: `num_training_steps` is the run's only stated length, and it counts micro-batches
        plan.micro_key = "sched_steps"
    if max_steps and max_steps > 0 and by_epochs and _counts_micro(max_steps, plan.micro_batches, accum):
        # Seed 002: max_steps was the micro-batch count. Judging the rest against it would bless every
        # other length sized the same wrong way; the epochs say what the run was meant to be.
        plan.optimizer_steps, plan.how, plan.max_steps_in_micro = by_epochs, epochs_how, True
        plan.micro_key = "max_steps"
        plan.notes.append(f"{at(cfg, 'max_steps')} {max_steps} counts micro-batches (see TG619): the plan"
                          f" follows the epochs instead")
    elif max_steps and max_steps > 0:
        plan.optimizer_steps = max_steps
        plan.how = f"max_steps {max_steps}"
    elif by_epochs:
        plan.optimizer_steps, plan.how = by_epochs, epochs_how
    else:
        plan.notes.append("the run's length is unknown: give the dataset size (--dataset-size N or dataset_size)"
                          " with epochs and batch size, or max_steps; checks that need it were skipped")
    stated = [name for name in ("max_steps", "sched_steps") if g(name)]
    if not plan.micro_per_epoch and g("epochs") and accum > 1 and stated:
        # Seed 002's bug needs the epoch's length to be seen; without it, say so rather than pass quietly
        keys = " and ".join(f"{at(cfg, n)} {g(n)}" for n in stated)
        plan.unchecked.append(f"whether {keys} counts micro-batches instead of optimizer steps (TG619, with"
                              f" {at(cfg, 'grad_accum')} {accum} and {g('epochs'):g} epochs): the epoch's length"
                              " is unknown (give --dataset-size, or batches_per_epoch in the config)")
    return plan


def _counts_micro(value: int, micro: int | None, accum: int) -> bool:
    """`value` is the micro-batch count (within 2%), and that is not the optimizer-step count."""
    return bool(micro and accum > 1 and abs(value - micro) <= max(1, 0.02 * micro))


def at(cfg: Config, name: str) -> str:
    """The key a config option was read from, as the file spells it (dotted), else the option's name."""
    return cfg.where.get(name, name)


def interval(cfg: Config, name: str, steps: int) -> int | None:
    """An eval/save interval in optimizer steps; below 1 it is a share of the run (Hugging Face's rule)."""
    every = cfg.get(name)
    if every is None or every <= 0:
        return None
    return max(1, math.ceil(every * steps)) if every < 1 else int(every)
