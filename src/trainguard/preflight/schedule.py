"""What is wrong with the whole LR schedule, simulated before the run.

The probe simulates it in the training process (probe/schedsim.py, at the preflight's last real step);
`schedule_findings` turns the result into findings (seed 002: a schedule sized for 75,000 micro-batches
stepped 4,687 times, or the reverse, put the LR at zero for 94% of the run).

Step = one optimizer update everywhere here; the curve's x is the optimizer step, its y the LR of the
first param group at that step.
"""

from __future__ import annotations

import math
from typing import Any

from trainguard.findings import PREFLIGHT, Code, Finding

ZERO = 1e-3  # an LR at most 0.1% of the peak is zero for training purposes
ZERO_SHARE = 0.10  # an LR at zero for more than this share of the run is an error
OVER_SHARE = 1 / 3  # a schedule over (flat at a decayed value) for more than this share of the run is an error
ENDLESS = ("StepLR", "ExponentialLR", "CyclicLR", "CosineAnnealingWarmRestarts")  # they never end: no "late"


def schedule_findings(sim: dict[str, Any]) -> list[Finding]:
    """Findings from a simulation: LR at zero for a large part of the run, a schedule that ends late."""
    if not sim or sim.get("skipped") or sim.get("truncated") or not sim.get("total_steps"):
        return []
    total = sim["total_steps"]
    out = []
    if sim.get("raised"):
        return [scheduler_raises(sim)]
    evidence = {k: sim.get(k) for k in ("scheduler", "total_steps", "grad_accum", "ratio", "peak_lr", "peak_at",
                                        "final_lr", "flat_from", "schedule_end")}
    flat_from, peak, final = sim.get("flat_from"), sim.get("peak_lr") or 0.0, sim.get("final_lr") or 0.0
    share = (total - flat_from + 1) / total if flat_from is not None else 0.0
    zero = final <= ZERO * peak
    if sim.get("over") and ((zero and share > ZERO_SHARE) or (final <= 0.5 * peak and share > OVER_SHARE)):
        out.append(schedule_ends_early(sim, evidence))
    if not out and sim.get("cycles"):
        out.append(lr_cycles(sim))
    end = sim.get("schedule_end")
    after = sim.get("lr_after_schedule_end")
    endless = any(n in ENDLESS for n in (sim.get("schedulers") or [sim.get("scheduler")]))
    if end is None and sim.get("next_low_at") is not None:
        end, after = sim["next_low_at"], sim["next_low_lr"]  # still decaying at the plan's end: where it bottoms out
    if (not out and end is not None and not endless and end > 1.25 * total and after is not None and peak > 0
            and abs(final - after) > 0.1 * peak):
        out.append(schedule_ends_late(sim, {**evidence, "schedule_end": end, "lr_after_schedule_end": after}))
    return out


def lr_cycles(sim: dict[str, Any]) -> Finding:
    """TG103 lr-cycles-to-zero, from preflight's simulated schedule (the rule's page is the live rule's)."""
    from trainguard.rules.schedule import LrCyclesToZero

    c = sim["cycles"]
    return Finding.of(
        LrCyclesToZero, step=c["first_zero_step"],
        summary=(f"the simulated LR falls to zero {c['zeros_in_plan']} times in the planned {sim['total_steps']} steps:"
                 f" at step {c['first_zero_step']}, back to {c['climbed_back_lr'] / c['peak_lr']:.0%} of its peak by"
                 f" step {c['climbed_back_step']}, at zero again at step {c['zero_again_step']}; {_stepping(sim)}"),
        evidence={"scheduler": sim.get("scheduler"), "total_steps": sim["total_steps"], "ratio": sim.get("ratio"),
                  **{k: c[k] for k in ("first_zero_step", "climbed_back_step", "zero_again_step", "zeros_in_plan",
                                       "peak_lr")}},
        fix=("Size the cosine for the whole run in optimizer steps (T_max = total_steps - warmup), or use"
             " CosineAnnealingWarmRestarts if restarts are meant. The curve is in schedule.json."),
        source="preflight",
    )


def _stepping(sim: dict[str, Any]) -> str:
    if sim.get("function"):
        return f"the LR is set by hand each optimizer step from {sim['function']}() (simulated by calling it)"
    r, accum = sim.get("ratio") or 0, sim.get("grad_accum") or 1
    if accum > 1 and abs(r - accum) < 0.01:
        return (f"the scheduler is stepped {r:g} times per optimizer step (once per micro-batch, with"
                f" gradient accumulation {accum})")
    if abs(r - 1) < 0.01:
        return "the scheduler is stepped once per optimizer step"
    return f"the scheduler is stepped {r:g} times per optimizer step"


def schedule_ends_early(sim: dict[str, Any], evidence: dict[str, Any]) -> Finding:
    """TG604 schedule-ends-early: the simulated LR schedule is over (often at zero) long before the run ends.

    ## What it detects
    Preflight steps a copy of the scheduler exactly as the script steps the real one
    (the number of scheduler steps per optimizer step is measured on the first real steps) for the
    planned `total_steps`, then past it; the schedule is over, and stays over, with the LR at zero for
    more than the last 10% of the plan, or at a decayed final value (at most half its peak) for more than
    the last third.

    ## Why it matters
    Seed 002 sized its schedule for 75,000 micro-batches while the optimizer stepped
    4,687 times: the schedule finished in 6% of the run and the LR was zero for the remaining 94%; the
    loss stayed flat for hours. Stepping the scheduler once per micro-batch with accumulation 8 does the
    same in reverse.

    ## Example
    The simulated LR schedule is over at step 126 of 1000: the LR stays at zero for the last 88%
    of the run; the scheduler is stepped 8 times per optimizer step (once per micro-batch, with gradient
    accumulation 8).

    ## What to change
    Size the schedule in optimizer steps (`ceil(batches / grad_accum) * epochs`) and step
    it once per optimizer step, right after `optimizer.step()`.
    A scheduler that raises when stepped past its length (OneCycleLR) within the plan is reported here
    too: the real run would crash at that step.

    ## Known false positives
    A schedule meant to end with a long stretch at a low constant LR (a step
    schedule whose last stage is over a third of the run).

    ## Options
    None. The thresholds (zero = 0.1% of the peak for over 10% of the run; a decayed LR for
    over a third of it) are fixed.
    """
    total = sim["total_steps"]
    flat_from = sim["flat_from"]
    share = (total - flat_from + 1) / total
    final, peak = sim.get("final_lr") or 0.0, sim["peak_lr"]
    level = "zero" if final <= ZERO * peak else f"{final:.3g} ({final / peak:.0%} of its peak {peak:.3g})"
    return Finding.of(
        SCHEDULE_ENDS_EARLY, step=flat_from,
        summary=(f"the simulated LR schedule is over at step {flat_from} of {total}: the LR stays at {level} for"
                 f" the last {share:.0%} of the run; {_stepping(sim)}"),
        evidence=evidence,
        fix=(f"Decay over the whole run: the length {sim['function']}() decays over (lr_decay_iters) equal to the"
             " run's optimizer steps (max_iters), and a floor (min_lr about a tenth of the peak)."
             " The curve is in schedule.json." if sim.get("function") else
             "Size the schedule in optimizer steps (batches per epoch / grad_accum × epochs) and call"
             " scheduler.step() once per optimizer step, after optimizer.step(). The curve is in schedule.json."),
        source="preflight",
    )


SCHEDULE_ENDS_EARLY = Code("TG604", "schedule-ends-early", "error", needs=(PREFLIGHT,),
                           page=schedule_ends_early, status="preview")


def scheduler_raises(sim: dict[str, Any]) -> Finding:
    raised = sim["raised"]
    return Finding.of(
        SCHEDULE_ENDS_EARLY, step=raised["step"], cause="scheduler-raises",
        summary=(f"the scheduler raises when the run reaches step {raised['step']} of {sim['total_steps']}:"
                 f" {raised['error']}; {_stepping(sim)}"),
        evidence={"raised": raised, "total_steps": sim["total_steps"], "ratio": sim.get("ratio"),
                  "scheduler": sim.get("scheduler")},
        fix="Size the scheduler for the run's optimizer steps and step it once per optimizer step.",
        source="preflight",
    )


def schedule_ends_late(sim: dict[str, Any], evidence: dict[str, Any]) -> Finding:
    """TG605 schedule-ends-late: the planned run ends long before the LR schedule does.

    ## What it detects
    Simulated past the plan, the schedule keeps changing until well after `total_steps`
    (more than 1.25 times the plan), and the LR at the plan's end is far (more than 10% of the peak) from
    where the schedule would have ended.

    ## Why it matters
    A schedule sized in micro-batches but stepped once per optimizer step runs
    `grad_accum` times too slowly: the warmup lasts `grad_accum` times longer and the decay never
    happens, so the run ends at a high LR and its final weights are not annealed.

    ## Example
    The schedule ends at step 8000 but the run at step 1000; the LR at the end is 0.00097
    (peak 0.001) instead of 0.

    ## What to change
    Size the schedule in optimizer steps, the same unit the scheduler is stepped in.

    ## Known false positives
    A run cut short on purpose (a smoke test) with the full run's schedule.

    ## Options
    None. The schedule is simulated up to 20 times the plan (at most 400,000 scheduler steps).
    """
    total = sim["total_steps"]
    return Finding.of(
        SCHEDULE_ENDS_LATE, step=total,
        summary=(f"the LR schedule ends at step {evidence['schedule_end']} but the run at step {total}: the LR at"
                 f" the end is {sim['final_lr']:.3g} ({sim['final_lr'] / sim['peak_lr']:.0%} of its peak"
                 f" {sim['peak_lr']:.3g}) instead of {evidence['lr_after_schedule_end']:.3g}; {_stepping(sim)}"),
        evidence=evidence,
        fix=("Size the schedule in optimizer steps (not micro-batches) and step it once per optimizer step."
             " The curve is in schedule.json."),
        source="preflight",
    )


SCHEDULE_ENDS_LATE = Code("TG605", "schedule-ends-late", "error", needs=(PREFLIGHT,),
                          page=schedule_ends_late, status="preview")


def fmt_duration(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "?"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"
