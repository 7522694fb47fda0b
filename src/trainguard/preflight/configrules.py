"""The config rules of `trainguard check` (TG611-TG619): a config's lengths, warmup, intervals, patience and
values against its plan (preflight/plan.py). Each rule returns findings, each finding's evidence names
the dotted keys it read; preflight/check.py runs them and fixes what they found.
"""

from __future__ import annotations

import math

from trainguard.findings import PREFLIGHT, Code, Finding
from trainguard.preflight.config import Config
from trainguard.preflight.plan import Plan, at, interval

PATIENCE_SHARE = 0.05  # early stopping that can fire within 5% of the run is too quick to judge a run
MANY_RUNS = 20  # a path run this often with an interval under MIN_INTERVAL steps dominates the run
MIN_INTERVAL = 10


def max_steps_counts_micro(cfg: Config, plan: Plan) -> list[Finding]:
    """TG619 max-steps-counts-micro-batches: `max_steps` is the number of micro-batches, not optimizer steps.

    ## What it detects
    `max_steps` (or `total_steps`, `max_iters`...) equal, within 2%, to the micro-batches of the
    configured epochs (micro-batches per epoch × epochs) while gradient accumulation is above 1.
    `max_steps` counts optimizer steps (Hugging Face's `TrainingArguments`, Lightning's `max_steps`, and
    every scheduler stepped after `optimizer.step()`), one per `grad_accum` micro-batches.

    ## Why it matters
    Seed 002: 3 epochs of 25,000 micro-batches with accumulation 16 and `max_steps` 75,000. The epochs
    make 4,686 optimizer steps. A trainer that obeys `max_steps` runs 16 times longer than the 3 epochs
    (48 epochs); a schedule sized from it is 6% done when the epochs end, and stepped per micro-batch
    it reaches zero after 6% of the run and stays there (seed 002's `lr=0.00e+00` for hours).

    ## Example
    `training.max_steps` is 75000, the micro-batches of 3 epochs (25000 per epoch × 3), but with
    gradient_accumulation_steps 16 those epochs make 1562 × 3 = 4686 optimizer steps.

    ## What to change
    Set `max_steps` to the optimizer steps (micro-batches per epoch // grad_accum × epochs), or drop it
    and let the epochs decide; `--fix` sets it.

    ## Known false positives
    A run meant to go `grad_accum` times as many epochs as configured (then the epochs are wrong).

    ## Options
    `--dataset-size N` (or `dataset_size` in the config) to count the micro-batches.
    """
    if not plan.micro_key:
        return []
    g = cfg.get
    accum, epochs, key = g("grad_accum", 1), g("epochs"), at(cfg, plan.micro_key)
    return [Finding.of(
        MAX_STEPS_COUNTS_MICRO_BATCHES,
        summary=(f"{key} is {g(plan.micro_key)}, the micro-batches of {epochs:g} epochs ({plan.micro_per_epoch} per"
                 f" epoch × {epochs:g}), but with {at(cfg, 'grad_accum')} {accum} those epochs make"
                 f" {plan.steps_per_epoch} × {epochs:g} = {plan.optimizer_steps} optimizer steps: max_steps counts"
                 f" optimizer steps, so the run (and a schedule sized from it) is {accum}x too long"),
        evidence={key: g(plan.micro_key), "micro_batches": plan.micro_batches, "micro_per_epoch": plan.micro_per_epoch,
                  at(cfg, "epochs"): epochs, at(cfg, "grad_accum"): accum,
                  "steps_per_epoch": plan.steps_per_epoch, "optimizer_steps": plan.optimizer_steps},
        fix=f"Set {key} to {plan.optimizer_steps} (or remove it and let the epochs decide).", source="check")]


MAX_STEPS_COUNTS_MICRO_BATCHES = Code("TG619", "max-steps-counts-micro-batches", "error", needs=(PREFLIGHT,),
                                      page=max_steps_counts_micro, status="preview")


def schedule_length(cfg: Config, plan: Plan) -> list[Finding]:
    """TG611 schedule-ignores-accumulation: the LR schedule's length counts micro-batches, not optimizer steps.

    ## What it detects
    The schedule length in the config (`num_training_steps`, `scheduler_steps`, `t_max`...)
    equals the number of micro-batches (optimizer steps × gradient accumulation) instead of the number
    of optimizer steps, which is what the scheduler is stepped in.

    ## Why it matters
    Seed 002 sized its schedule for 75,000 micro-batches with accumulation 16; the
    optimizer stepped 4,687 times, so the schedule was 6% done at the end of the run. With a schedule
    sized right but stepped per micro-batch the LR sits at zero for 94% of the run instead.

    ## Example
    `num_training_steps` 75000 = 4687 optimizer steps × gradient_accumulation_steps 16.

    ## What to change
    Set the schedule length to the optimizer steps; `--fix` does (and rescales a warmup
    that was a share of the wrong length).

    ## Known false positives
    A script that really steps its scheduler once per micro-batch; preflight's
    simulation (`trainguard preflight`) tells which.

    ## Options
    `--dataset-size N` (or `dataset_size` in the config) to compute the run's length.
    """
    g = cfg.get
    sched, steps, accum = g("sched_steps"), plan.optimizer_steps, g("grad_accum", 1)
    if not sched or not steps or plan.micro_key == "sched_steps":  # TG619 already names it
        return []
    ev = {at(cfg, "sched_steps"): sched, "optimizer_steps": steps, at(cfg, "grad_accum"): accum,
          "plan": plan.how}
    micro = steps * accum
    if accum > 1 and abs(sched - micro) <= max(1, 0.02 * micro):
        return [Finding.of(
            SCHEDULE_IGNORES_ACCUMULATION,
            summary=(f"{at(cfg, 'sched_steps')} is {sched}, the number of micro-batches, but the run makes {steps}"
                     f" optimizer steps (gradient accumulation {accum}): the schedule is sized {accum}x too long"),
            evidence=ev, fix=f"Set {at(cfg, 'sched_steps')} to {steps}.", source="check")]
    if abs(sched - steps) <= max(1, 0.1 * steps):
        return []
    shorter = sched < steps
    return [Finding.of(
        SCHEDULE_LENGTH_MISMATCH, severity="error" if shorter else "warning",
        summary=(f"{at(cfg, 'sched_steps')} is {sched} but the run makes {steps} optimizer steps: the schedule "
                 + (f"is over at {sched / steps:.0%} of the run" if shorter else
                    f"is {sched / steps:.0%} longer than the run and never finishes its decay")),
        evidence=ev, fix=f"Set {at(cfg, 'sched_steps')} to {steps}.", source="check")]


SCHEDULE_IGNORES_ACCUMULATION = Code("TG611", "schedule-ignores-accumulation", "error", needs=(PREFLIGHT,),
                                     page=schedule_length, status="preview")


def schedule_length_mismatch() -> None:
    """TG612 schedule-length-mismatch: the LR schedule's length differs from the run's optimizer steps.

    ## What it detects
    A schedule length in the config more than 10% away from the planned optimizer steps
    (and not explained by gradient accumulation, which TG611 names).

    ## Why it matters
    A schedule shorter than the run leaves the LR at its final value (often zero) for the
    rest of the run (error); a longer one never finishes its decay (warning).

    ## Example
    `num_training_steps` 2000 but the run makes 4687 optimizer steps: the schedule is over at 43%.

    ## What to change
    Derive the schedule length from the plan (steps per epoch × epochs, or max_steps).

    ## Known false positives
    A run stopped early on purpose, with the full run's schedule.

    ## Options
    None: 10% of slack either way.
    """


SCHEDULE_LENGTH_MISMATCH = Code("TG612", "schedule-length-mismatch", "error", needs=(PREFLIGHT,),
                                page=schedule_length_mismatch, status="preview")


def warmup(cfg: Config, steps: int) -> list[Finding]:
    """TG613 warmup-exceeds-run: the LR warmup lasts as long as the run, or most of it.

    ## What it detects
    `warmup_steps` (or `warmup_ratio` × optimizer steps) at or beyond the run's
    optimizer steps (error), or over half of them (warning).

    ## Why it matters
    The LR never reaches its peak; a warmup computed as a share of a schedule sized in
    micro-batches (seed 002's mistake) lands here.

    ## Example
    `warmup_steps` 7500 but the run makes 4687 optimizer steps.

    ## What to change
    A warmup of a few percent of the run (`--fix` keeps the share of the schedule the
    warmup was meant to have, or uses 10%).

    ## Known false positives
    None known.

    ## Options
    None.
    """
    g = cfg.get
    if g("warmup_steps"):  # Hugging Face: warmup_steps > 0 wins over warmup_ratio
        w, key = g("warmup_steps"), at(cfg, "warmup_steps")
    elif g("warmup_ratio") is not None:
        w, key = g("warmup_ratio") * steps, at(cfg, "warmup_ratio")
    else:
        return []
    if w < 0.5 * steps:
        return []
    severity = "error" if w >= steps else "warning"
    what = "at or beyond" if w >= steps else f"{w / steps:.0%} of"
    return [Finding.of(
        WARMUP_EXCEEDS_RUN, severity=severity,
        summary=f"the warmup ({key}: {w:g} steps) is {what} the run's {steps} optimizer steps: the LR never"
                f" {'reaches' if w >= steps else 'spends long at'} its peak",
        evidence={key: g("warmup_steps") or g("warmup_ratio"),
                  "warmup_steps": w, "optimizer_steps": steps},
        fix=f"Use a warmup of about {max(1, round(0.1 * steps))} steps (10% of the run).", source="check")]


WARMUP_EXCEEDS_RUN = Code("TG613", "warmup-exceeds-run", "error", needs=(PREFLIGHT,),
                          page=warmup, status="preview")


def warmup_ignored(cfg: Config) -> list[Finding]:
    """TG618 warmup-ignored: a warmup is configured for a scheduler type that has none.

    ## What it detects
    `warmup_steps` or `warmup_ratio` above zero with `lr_scheduler_type: constant` (Hugging Face's
    `get_constant_schedule` takes no warmup; `constant_with_warmup` does).

    ## Why it matters
    The run starts at the full LR from step 1 although the config says it warms up; with large models
    and Adam that early spike is a common cause of divergence in the first hundred steps.

    ## Example
    `lr_scheduler_type` constant with `warmup_steps` 500: the 500 warmup steps never happen.

    ## What to change
    Use `constant_with_warmup`, or drop the warmup setting; `--fix` switches the type.

    ## Known false positives
    A training script that builds its own scheduler and reads the warmup itself (then the type is not
    Hugging Face's).

    ## Options
    None.
    """
    g = cfg.get
    if g("scheduler") != "constant" or not (g("warmup_steps") or g("warmup_ratio")):
        return []
    wkey = at(cfg, "warmup_steps") if g("warmup_steps") else at(cfg, "warmup_ratio")
    return [Finding.of(
        WARMUP_IGNORED,
        summary=f"{at(cfg, 'scheduler')} is 'constant', which has no warmup: {wkey} {g('warmup_steps') or g('warmup_ratio')}"
                " is ignored and the run starts at the full LR",
        evidence={at(cfg, "scheduler"): "constant", wkey: g("warmup_steps") or g("warmup_ratio")},
        fix=f"Set {at(cfg, 'scheduler')} to constant_with_warmup.", source="check")]


WARMUP_IGNORED = Code("TG618", "warmup-ignored", "warning", needs=(PREFLIGHT,),
                      page=warmup_ignored, status="preview")


def intervals(cfg: Config, steps: int) -> list[Finding]:
    """TG614 interval-exceeds-run: an eval or save interval is longer than the run, so it never happens.

    ## What it detects
    `eval_steps` or `save_steps` (with a "steps" strategy or none given) greater than
    the planned optimizer steps.

    ## Why it matters
    No evaluation means no metric, no early stopping and no best model; no save means a
    crash loses the whole run. Nobody notices until the end.

    ## Example
    `eval_steps` 5000 but the run makes 4687 optimizer steps.

    ## What to change
    An interval of at most the run's length; `--fix` uses a tenth of the run.

    ## Known false positives
    A path meant to run only in longer runs.

    ## Options
    None.
    """
    out = []
    for name, label in (("eval_steps", "eval"), ("save_steps", "save")):
        every = interval(cfg, name, steps)
        strategy = cfg.get(f"{label}_strategy", "steps")
        if not every or strategy != "steps":
            continue
        key = at(cfg, name)
        if every > steps:
            out.append(Finding.of(
                INTERVAL_EXCEEDS_RUN,
                summary=f"{key} is {every} but the run makes {steps} optimizer steps: the {label} never happens",
                evidence={key: every, "optimizer_steps": steps},
                fix=f"Set {key} to at most {steps} (e.g. {max(1, steps // 10)}).", source="check"))
        elif every < MIN_INTERVAL and steps // every > MANY_RUNS:
            out.append(interval_dominates(key, label, every, steps))
    return out


INTERVAL_EXCEEDS_RUN = Code("TG614", "interval-exceeds-run", "error", needs=(PREFLIGHT,),
                            page=intervals, status="preview")


def interval_dominates(key: str, label: str, every: int, steps: int) -> Finding:
    """TG615 interval-dominates-run: an eval or save interval so short that the path dominates the run.

    ## What it detects
    An interval under 10 optimizer steps that runs the path more than 20 times.

    ## Why it matters
    Each evaluation or checkpoint costs many training steps' worth of time; the run
    spends most of its hours evaluating or writing checkpoints. (`trainguard preflight` measures the
    path's real cost.)

    ## Example
    `eval_steps` 2 in a 4687-step run: 2343 evaluations.

    ## What to change
    Evaluate or save every few hundred steps, or a few times per epoch.

    ## Known false positives
    A tiny eval set or a debugging run.

    ## Options
    None: under 10 steps and more than 20 runs.
    """
    return Finding.of(
        INTERVAL_DOMINATES_RUN,
        summary=f"{key} is {every}: the {label} runs {steps // every} times in {steps} optimizer steps",
        evidence={key: every, "optimizer_steps": steps, "runs": steps // every},
        fix=f"Set {key} to about {max(MIN_INTERVAL, steps // 10)}.", source="check")


INTERVAL_DOMINATES_RUN = Code("TG615", "interval-dominates-run", "warning", needs=(PREFLIGHT,),
                              page=interval_dominates, status="preview")


def patience(cfg: Config, steps: int) -> list[Finding]:
    """TG616 patience-too-short: early stopping can end the run before it had a fair chance.

    ## What it detects
    `early_stopping_patience` × `eval_steps` shorter than a curriculum's ramp
    (`curriculum_steps`, or `curriculum_ratio` × the run), as error; or shorter than 5% of the run, as
    warning.

    ## Why it matters
    Seed 004 stopped at 50% of its run after 10 evaluations without improvement, while
    its curriculum was still raising the weights of the loss parts (so the loss rose by design).

    ## Example
    Patience 10 × eval_steps 500 = 5000 steps, but the curriculum ramps for 12,457 steps.

    ## What to change
    Patience that covers the curriculum's ramp plus the usual patience; `--fix` sets it.

    ## Known false positives
    A curriculum whose loss is comparable across its stages (rare).

    ## Options
    None: 5% of the run is the floor without a curriculum.
    """
    g = cfg.get
    pat, every = g("patience"), interval(cfg, "eval_steps", steps)
    if not pat or not every or pat <= 0 or every <= 0 or every > steps:
        return []
    window = pat * every
    ramp = g("curriculum_steps") or (round(g("curriculum_ratio") * steps) if g("curriculum_ratio") else None)
    key = at(cfg, "patience")
    ev = {key: pat, at(cfg, "eval_steps"): every, "patience_steps": window, "optimizer_steps": steps}
    if ramp and window < ramp:
        ev["curriculum_ramp_steps"] = ramp
        return [Finding.of(
            PATIENCE_TOO_SHORT, cause="shorter-than-curriculum",
            summary=(f"early stopping can end the run after {window} steps without improvement ({key} {pat} ×"
                     f" eval every {every}), but the curriculum ramps for {ramp} steps: the loss rises by design"
                     " while it ramps"),
            evidence=ev, fix=f"Set {key} to at least {math.ceil(ramp / every) + pat}.", source="check")]
    if window < PATIENCE_SHARE * steps:
        return [Finding.of(
            PATIENCE_TOO_SHORT, severity="warning", cause="short-for-run",
            summary=(f"early stopping can end the run after {window} steps without improvement ({key} {pat} ×"
                     f" eval every {every}), {window / steps:.1%} of its {steps} steps"),
            evidence=ev, fix=f"Set {key} to at least {math.ceil(PATIENCE_SHARE * steps / every)}.", source="check")]
    return []


PATIENCE_TOO_SHORT = Code("TG616", "patience-too-short", "error", needs=(PREFLIGHT,),
                          page=patience, status="preview")


def implausible(cfg: Config) -> list[Finding]:
    """TG617 implausible-value: a hyperparameter outside any range that trains.

    ## What it detects
    A learning rate ≤ 0 or > 1 (error) or below 1e-7 (warning); a distillation
    temperature ≤ 0 (error) or above 20 (warning); a KD top-k ≤ 0 or above the vocabulary size; a max
    length ≤ 0 or above the model's positions; a batch size, gradient accumulation or epoch count ≤ 0;
    a warmup ratio outside [0, 1).

    ## Why it matters
    Each of these either crashes hours in or trains nothing, silently.

    ## Example
    `learning_rate` 3.0 (did you mean 3e-4?); kd_top_k 60000 with vocab_size 49152.

    ## What to change
    The value named; `--fix` does not guess these.

    ## Known false positives
    An LR above 1 for an optimizer that rescales it (LARS, some Adafactor modes).

    ## Options
    None.
    """
    g = cfg.get
    out = []

    def bad(name: str, severity: str, why: str) -> None:
        key = at(cfg, name)
        out.append(Finding.of(IMPLAUSIBLE_VALUE, severity=severity, cause=name,
                           summary=f"{key} is {g(name)!r}: {why}", evidence={key: g(name)},
                           fix=f"Check {key}.", source="check"))

    lr = g("lr")
    if lr is not None:
        if lr <= 0:
            bad("lr", "error", "the model cannot learn with a learning rate ≤ 0")
        elif lr > 1:
            bad("lr", "error", "a learning rate above 1 diverges with Adam-type and SGD optimizers alike")
        elif lr < 1e-7:
            bad("lr", "warning", "a learning rate below 1e-7 barely moves the weights")
    t = g("temperature")
    if t is not None:
        if t <= 0:
            bad("temperature", "error", "a softmax temperature must be positive")
        elif t > 20:
            bad("temperature", "warning", "above 20 the softened distributions are nearly uniform")
    k = g("kd_top_k")
    if k is not None:
        if k <= 0:
            bad("kd_top_k", "error", "top-k must be at least 1 (or null for the full vocabulary)")
        elif g("vocab_size") and k > g("vocab_size"):
            bad("kd_top_k", "error", f"larger than the vocabulary ({g('vocab_size')})")
    n = g("max_length")
    if n is not None:
        if n <= 0:
            bad("max_length", "error", "a sequence length must be positive")
        elif g("max_positions") and n > g("max_positions"):
            bad("max_length", "error", f"longer than the model's {g('max_positions')} positions")
    for name in ("batch_size", "grad_accum", "epochs", "world_size"):
        if g(name) is not None and g(name) <= 0:
            bad(name, "error", "must be positive")
    r = g("warmup_ratio")
    if r is not None and not 0 <= r < 1:
        bad("warmup_ratio", "error", "a warmup ratio is a share of the run, in [0, 1)")
    return out


IMPLAUSIBLE_VALUE = Code("TG617", "implausible-value", "error", needs=(PREFLIGHT,),
                         page=implausible, status="preview")
