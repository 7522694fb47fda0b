"""The whole LR schedule, simulated in the training process for preflight.

`simulate` runs at the preflight's last real step (probe/fastforward.py) on a deep copy of the user's
scheduler: it steps the copy exactly as the script steps the real one (`ratio` scheduler steps per
optimizer step, measured on the real steps) for the planned number of optimizer steps, then on past the
plan to see where the schedule itself ends. preflight/schedule.py judges the result.

Step = one optimizer update everywhere here; the curve's x is the optimizer step, its y the LR of the
first param group at that step.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

MAX_SCHED_STEPS = 400_000  # a bound on the simulation's cost (a LambdaLR step is ~5 µs on a CPU)
CURVE_POINTS = 1000  # points kept in schedule.json for the report
LOW = 0.01  # LRs within 1% of the peak of each other count as the same value (a flat stretch)
EXTEND = 20  # simulate up to this many times the plan to find where the schedule itself ends


def simulate(sched: Any, *, ratio: float, offset: int, total_steps: int | None, grad_accum: int) -> dict[str, Any]:
    """Steps `sched` (a private copy) as the script does and returns the curve and its landmarks."""
    from trainguard.probe.planinfo import sched_names

    result: dict[str, Any] = {"scheduler": type(sched).__name__, "schedulers": sched_names(sched), "ratio": ratio,
                              "offset": offset, "total_steps": total_steps, "grad_accum": grad_accum,
                              "horizon": getattr(sched, "total_steps", None)}
    if not total_steps:
        result["skipped"] = "no total_steps in trainguard.watch(): the plan's length is unknown"
        return result
    if type(sched).__name__ == "ReduceLROnPlateau":
        result["skipped"] = "ReduceLROnPlateau follows the metrics: there is no schedule to simulate"
        return result
    if ratio <= 0:
        result["skipped"] = "the scheduler was not stepped during the first optimizer steps (stepped per epoch?)"
        return result
    done = 0

    def lr_at(k: int) -> float:
        nonlocal done
        target = offset + round((k - 1) * ratio)
        while done < target:
            sched.step()
            done += 1
        return float(sched.optimizer.param_groups[0]["lr"])

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "lr_scheduler.step() before optimizer.step()": the copy has no optimizer steps
        return _run(lr_at, result, max(1, min(total_steps * EXTEND, int(MAX_SCHED_STEPS / ratio))))


def simulate_function(fn: Any, *, shift: int, total_steps: int | None, grad_accum: int, name: str) -> dict[str, Any]:
    """The LR set by hand: `fn(k + shift)` is the LR of optimizer step k (found and checked by the probe)."""
    result: dict[str, Any] = {"scheduler": f"{name}() (LR set by hand)", "function": name, "shift": shift,
                              "ratio": 1.0, "offset": 0, "total_steps": total_steps, "grad_accum": grad_accum}
    if not total_steps:
        result["skipped"] = "no total_steps in trainguard.watch(): the plan's length is unknown"
        return result
    return _run(lambda k: float(fn(k + shift)), result, max(1, min(total_steps * EXTEND, MAX_SCHED_STEPS)))


def _run(lr_at: Any, result: dict[str, Any], n: int) -> dict[str, Any]:
    """Reads the LR of optimizer steps 1..n (stopping once it is flat long enough past the plan)."""
    total_steps = result["total_steps"]
    lrs: list[float] = []
    settle = max(10, total_steps // 4) + 2  # past the plan, this many flat steps say the schedule is over
    flat, tol = 0, 0.0
    for k in range(1, n + 1):
        try:
            lrs.append(lr_at(k))
        except Exception as exc:  # e.g. OneCycleLR stepped past its total_steps raises ValueError
            if k <= total_steps:
                result["raised"] = {"step": k, "error": f"{type(exc).__name__}: {exc}"[:300]}
            break
        if k == total_steps:
            tol = 1e-4 * max(lrs)  # tight: a slow decay (a cosine just past its peak) is not "flat"
        elif k > total_steps:
            flat = flat + 1 if abs(lrs[-1] - lrs[-2]) <= tol and abs(lrs[-1] - lrs[-1 - flat]) <= tol else 0
            if flat >= settle:
                break  # flat long enough past the plan: where it ends is known, no need to go on
    if len(lrs) < total_steps and "raised" not in result:
        result["truncated"] = f"simulated {len(lrs)} of {total_steps} planned steps (bounded cost)"
    if not lrs:
        return result
    plan = lrs[:total_steps]
    result.update(_landmarks(lrs, plan, total_steps))
    result["cycles"] = _cycles(plan, result)
    stride = max(1, math.ceil(len(plan) / CURVE_POINTS))
    result["curve"] = [[k + 1, plan[k]] for k in range(0, len(plan), stride)] + [[len(plan), plan[-1]]]
    result["simulated_steps"] = len(lrs)
    return result


def _cycles(plan: list[float], result: dict[str, Any]) -> dict[str, Any] | None:
    """The live rule TG103 (lr-cycles-to-zero) run over the simulated curve: the same judgement."""
    from trainguard.rules.schedule import LrCyclesToZero

    rule = LrCyclesToZero({"total_steps": result["total_steps"], "schedulers": result.get("schedulers")
                           or [result.get("scheduler")]})
    for k, lr in enumerate(plan, 1):
        found = rule.on_step({"step": k, "lr": lr})
        if found is not None:
            zeros = sum(1 for i in range(1, len(plan)) if plan[i] <= 0.01 * found.evidence["peak_lr"] < plan[i - 1])
            return {**found.evidence, "zeros_in_plan": zeros}
    return None


def _landmarks(lrs: list[float], plan: list[float], total: int) -> dict[str, Any]:
    peak = max(plan) if plan else 0.0
    out: dict[str, Any] = {"peak_lr": peak, "final_lr": plan[-1] if plan else None,
                           "planned_simulated": len(plan)}
    if not plan or peak <= 0:
        out.update(flat_from=1, over=True)
        return out
    out["peak_at"] = plan.index(peak) + 1
    # the first step from which the LR stays at its final value (within 1% of the peak) to the plan's end
    out["flat_from"] = _flat_from(plan, tol=LOW * peak)
    # where the schedule itself ends, simulated past the plan (None: it never settles, e.g. restarts)
    end = _flat_from(lrs, tol=LOW * peak)
    settled = len(lrs) > total and end < len(lrs) - max(10, total // 4)
    out["schedule_end"] = end if settled else None
    out["lr_after_schedule_end"] = lrs[-1] if settled else None
    if not settled and len(lrs) > total:
        # A schedule that never settles past the plan (a periodic cosine): how low its decay goes next.
        k = total
        while k < len(lrs) and lrs[k] <= lrs[k - 1]:
            k += 1
        low = min(range(total - 1, k), key=lambda i: lrs[i])
        out["next_low_at"], out["next_low_lr"] = low + 1, lrs[low]
    # over: flat from `flat_from` to the end of the plan and, as far as simulated, beyond it
    out["over"] = bool(len(lrs) <= total or (settled and end <= out["flat_from"] + 1))
    return out


def _flat_from(lrs: list[float], *, tol: float) -> int:
    final = lrs[-1]
    k = len(lrs)
    while k > 1 and abs(lrs[k - 2] - final) <= tol:
        k -= 1
    return k
