"""A run against its job's time limit: the plan that cannot fit it (TG551), and the cut itself (TG552).

The rate is the run's own: wall seconds per optimizer step since its first step, evaluations and saves
included (they come out of the same time limit). The plan is the probe's (`watch(total_steps=...)`, a
scheduler's horizon, a framework's max_steps) or the `/N` of printed step lines.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from trainguard.findings import PROCESS, Code, Finding
from trainguard.rules.scheduler import cut_by_scheduler as scheduler_cut
from trainguard.rules.scheduler import node_lost
from trainguard.watchdog.slurm import NodeState, SlurmJob, describe

MIN_STEPS = 5  # steps measured before the rate is trusted
MIN_SECONDS = 10.0  # ...and seconds
CHECK_EVERY = 5.0  # seconds between projections (cheap, but the rate needs time to settle)


def _hms(seconds: float) -> str:
    s = max(0, int(round(seconds)))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def checkpoint_steps(events: list[dict[str, Any]]) -> list[int]:
    return sorted({int(e["step"]) for e in events if isinstance(e.get("step"), int)})


def last_checkpoint_before(cut_step: int, saved: list[int]) -> int | None:
    """The last checkpoint the run will have written by `cut_step`, at its own interval so far."""
    if not saved:
        return None
    if len(saved) < 2:
        return saved[-1]
    interval = statistics.median(b - a for a, b in zip(saved, saved[1:]))
    if interval <= 0:
        return saved[-1]
    k = int((cut_step - saved[-1]) // interval)
    return int(saved[-1] + max(0, k) * interval)


def plan_exceeds_time_limit(job: SlurmJob, *, step: int, total: int, rate: float, now: float,
                            checkpoints: list[int], source: str = "watchdog") -> Finding | None:
    """TG551 plan-exceeds-time-limit: the planned steps at the run's own rate end after the job's time limit.

    What it detects: under a job scheduler (Slurm), the steps left of the plan at the run's measured wall
    time per step (evaluations and saves included) need longer than the job has left before its end.
    Why it matters: the scheduler kills the job at its limit; a run planned for 19,560 steps at 3.8 s a step
    that is given 48 minutes trains 750 steps and is cancelled, and everything after its last checkpoint is
    lost. Seen in a public llm.c run, `CANCELLED ... DUE TO TIME LIMIT` at step 750 of 19,560.
    Example: at 3.80 s/step, 18,810 steps left need 19:51:18; job 4182 ends in 0:47:02: the run will reach
    about step 1,492 (8% of 19,560); the last checkpoint before the cut at step 1,000.
    What to change: ask for the time the plan needs (`--time`), plan fewer steps, or make the run resumable:
    save a checkpoint every N steps, have Slurm warn the script before the limit (`--signal=B:USR1@120`,
    `guard.stop_requested`) and chain jobs (`--requeue`, `sbatch --dependency=afterany:JOBID`).
    Known false positives: a rate measured during a slow start (compilation, a first evaluation) is
    re-measured: the finding is said once, when the projection first passes the limit by a margin.
    """
    left = job.seconds_left(now)
    if left is None or total <= step or rate <= 0:
        return None
    need = (total - step) * rate
    if need <= left + max(30.0, 0.02 * left):
        return None
    cut = step + int(left / rate)
    last_ckpt = last_checkpoint_before(cut, checkpoints)
    ckpt = (f"the last checkpoint before the cut at about step {last_ckpt:,}" if last_ckpt is not None else
            "no checkpoint has been reported: the cut loses everything")
    summary = (f"at {rate:.2f} s/step, the {total - step:,} steps left need {_hms(need)}; {job.label()} ends in "
               f"{_hms(left)}: the run will reach about step {cut:,} ({100 * cut / total:.0f}% of {total:,}); {ckpt}")
    ask = _hms(need * 1.1 + max(0.0, now - (job.start or now)))
    return Finding.of(
        PLAN_EXCEEDS_TIME_LIMIT, step=step, t=now, source=source, cause="time-limit",
        summary=summary,
        evidence={"job": job.job_id, "seconds_per_step": round(rate, 4), "step": step, "total_steps": total,
                  "seconds_needed": round(need, 1), "seconds_left": round(left, 1), "time_limit_s": job.time_limit_s,
                  "job_end": job.end, "projected_cut_step": cut, "checkpoints": checkpoints[-5:],
                  "last_checkpoint_before_cut": last_ckpt},
        fix=(f"Ask for the time the plan needs at this rate (sbatch --time={ask} or more), or plan about "
             f"{cut:,} steps; or make the run resumable: save a checkpoint every few hundred steps, have Slurm "
             "warn the script before the limit (--signal=B:USR1@120; under trainguard, guard.stop_requested turns "
             "true) and continue in a chained job (--requeue, or sbatch --dependency=afterany:JOBID)."),
    )


PLAN_EXCEEDS_TIME_LIMIT = Code("TG551", "plan-exceeds-time-limit", "warning", needs=(PROCESS,),
                               page=plan_exceeds_time_limit, since="0.2.0")


def cut_by_scheduler(job: SlurmJob, cause: str, *, signal_name: str, step: int | None, total: int | None,
                     signalled_at: float, checkpoints_after: list[int], last_checkpoint: int | None,
                     warned: bool = False) -> Finding:
    """TG552 cut-by-scheduler (its page: rules/scheduler.py) for a run under `trainguard run`: what was saved
    after the scheduler's first signal decides the fix (a job already warned is not told to ask for a warning)."""
    of_plan = f" of {total:,} ({100 * step / total:.0f}%)" if step is not None and total else ""
    at = f" at step {step:,}{of_plan}" if step is not None else ""
    if checkpoints_after:
        saved = f"; a checkpoint was saved after the signal (step {checkpoints_after[-1]:,})"
    elif last_checkpoint is not None:
        saved = f"; no checkpoint after the signal: the last one is at step {last_checkpoint:,}"
    else:
        saved = "; no checkpoint was reported"
    resume_from = checkpoints_after[-1] if checkpoints_after else last_checkpoint
    go_on = (f"Continue from the checkpoint at step {resume_from:,}" if resume_from is not None
             else "Continue (from the start: nothing was saved)")
    chain = " in a job with the time the rest needs, or chain jobs (--requeue, sbatch --dependency=afterany:JOBID)"
    if cause == "cancelled":
        fix = "The job was cancelled with scancel: if that was not meant, find who cancelled it (sacct -j JOBID)."
    elif checkpoints_after:
        fix = go_on + chain + "; the warning and the save worked as meant: nothing to change in the script."
    elif warned:
        fix = (go_on + chain + "; the script was warned (guard.stop_requested turned true, the signal passed on to a "
               "handler) but saved nothing after it: save a checkpoint when guard.stop_requested turns true.")
    elif cause in ("preempted", "requeued"):
        fix = (go_on + "; a requeued job continues this run folder as its next attempt. To lose less, save when "
               "guard.stop_requested turns true (it does on the scheduler's SIGTERM, KillWait seconds before "
               "SIGKILL) and save every few hundred steps.")
    else:
        fix = (go_on + chain + "; to save in the grace time, ask Slurm for a warning (--signal=B:USR1@120) and save "
               "when guard.stop_requested turns true.")
    return scheduler_cut(
        step=step, t=signalled_at, source="watchdog", cause=cause,
        summary=f"{job.label()} {describe(cause)} ({signal_name}){at}{saved}",
        evidence={"job": job.job_id, "cause": cause, "signal": signal_name, "restarts": job.restarts,
                  "time_limit_s": job.time_limit_s, "job_end": job.end, "signalled_at": signalled_at,
                  "step": step, "total_steps": total, "checkpoints_after_signal": checkpoints_after,
                  "last_checkpoint": last_checkpoint, "warned": warned},
        fix=fix,
    )


def node_failed(job: SlurmJob, lost: list[NodeState], *, signal_name: str, step: int | None, total: int | None,
                signalled_at: float, last_checkpoint: int | None) -> Finding:
    """TG711 node-lost (its page: rules/scheduler.py), as Slurm tells it: a node of the job failed, named with
    Slurm's own reason (`scontrol show node`'s State and Reason, `sacct`'s NODE_FAIL); the signal that ended
    this node's part is its consequence."""
    names = ", ".join(n.name for n in lost) or f"of {job.nodes or 'its nodes'}"
    why = "; ".join(f"{n.name}: {n.state}" + (f", reason \"{n.reason}\"" if n.reason else "") for n in lost) \
        or "NODE_FAIL, without naming the node any more"
    of_plan = f" of {total:,}" if step is not None and total else ""
    at = f" at step {step:,}{of_plan}" if step is not None else ""
    ckpt = (f"the last checkpoint is at step {last_checkpoint:,}" if last_checkpoint is not None
            else "no checkpoint was reported")
    return node_lost(
        step=step, t=signalled_at, source="watchdog", cause="node-failure", where=f"node {names}",
        summary=(f"{job.label()} lost node {names} (Slurm says {why}); this part was ended ({signal_name}){at}; "
                 f"{ckpt}"),
        evidence={"job": job.job_id, "lost_nodes": [n.name for n in lost], "node_states": [n.state for n in lost],
                  "slurm_reasons": [n.reason for n in lost], "signal": signal_name, "this_node": job.node,
                  "step": step, "total_steps": total, "last_checkpoint": last_checkpoint},
        fix=(f"Look at node {names} (scontrol show node {lost[0].name if lost else 'NAME'}; its slurmd log; the "
             "kernel log) and, once "
             "it is back or excluded (sbatch --exclude), continue from the last checkpoint; --requeue lets Slurm "
             "restart the job on other nodes as this run's next attempt."),
    )


class PlanVsTimeLimit:
    """A Supervisor monitor: projects the plan at the run's rate against the job's end; says TG551 once."""

    def __init__(self, job: SlurmJob, clock: Any = time.time) -> None:
        self.job = job
        self.clock = clock
        self._first: tuple[float, int] | None = None
        self._last: tuple[float, int] | None = None  # when the step last changed, by this monitor's clock
        self._next = 0.0
        self.done = False  # said once; also set by the scheduler's signal (the projection is moot then)

    def poll(self, state: Any) -> list[Finding]:
        if self.done or state.step is None or state.step <= 0:
            return []
        now = self.clock()
        if self._first is None:
            self._first = self._last = (now, state.step)
            return []
        stepped = self._last is not None and state.step != self._last[1]
        if stepped:
            self._last = (now, state.step)
        # a run that stopped stepping (it ended, or saved and stops) is not projected: its rate would only grow
        if now < self._next or not stepped:
            return []
        self._next = now + CHECK_EVERY
        t0, s0 = self._first
        if state.step - s0 < MIN_STEPS or now - t0 < MIN_SECONDS:
            return []
        total = _planned_steps(state)
        if not total:
            return []
        rate = (now - t0) / (state.step - s0)
        finding = plan_exceeds_time_limit(self.job, step=state.step, total=int(total), rate=rate, now=now,
                                          checkpoints=checkpoint_steps(state.reader.events("checkpoint")))
        if finding is not None:
            self.done = True
            return [finding]
        return []


def _planned_steps(state: Any) -> int | None:
    plan = state.reader.meta().get("plan") or {}
    total = plan.get("total_steps")
    if isinstance(total, int) and total > 0:
        return total
    printed = (state.scratch or {}).get("printed_total")
    return printed if isinstance(printed, int) and printed > 0 else None
