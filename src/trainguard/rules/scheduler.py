"""How a job scheduler ended a run, declared once for the watchdog (watchdog/scheduler.py, watchdog/nodes.py)
and `diagnose` (a log's `slurmstepd: *** JOB 4182 ON node07 CANCELLED AT ... DUE TO TIME LIMIT ***`) alike:
one code for one event, whoever saw it.

- TG552 cut-by-scheduler: the scheduler cut the run (its time limit, a warning before it, a preemption, a
  requeue, a cancel); the run's state is `cut-off`.
- TG711 node-lost: a node of the job went away (the watchdogs' beats stopped, or Slurm says it failed).
"""

from __future__ import annotations

from typing import Any

from trainguard.findings import NODES, PROCESS, Code, Finding


def cut_by_scheduler(*, cause: str, summary: str, evidence: dict[str, Any], fix: str, step: int | None = None,
                     t: float | None = None, source: str = "watchdog") -> Finding:
    """TG552 cut-by-scheduler: the job scheduler ended the run (its time limit, a preemption, a cancel).

    What it detects: the signal that ended a run under Slurm came from the scheduler: the job reached its
    time limit (or was warned of it by `--signal` and stopped), was preempted or requeued, or was cancelled;
    told apart from a crash or a user's kill by the job's own state in `scontrol` when the signal came. The
    run's state is `cut-off` (a cancel under `trainguard run`: `killed`). `trainguard diagnose` gives the same
    code for a log whose last failure line is the scheduler's (`CANCELLED AT ... DUE TO TIME LIMIT`, LSF's
    `TERM_RUNLIMIT`), with how much of the plan the run had reached.
    Why it matters: a run cut by its time limit is not broken; it needs more time or a continuation, and
    what it can continue from is its last checkpoint: the finding says whether one was saved after the
    signal, in the grace time.
    Example: job 4182 reached its time limit (SIGTERM) at step 750 of 19,560 (4%); no checkpoint after the
    signal: the last one is at step 500.
    What to change: the cause decides. Continue from the last checkpoint in a job with the time the rest
    needs, or chain jobs; a job that was not warned gets a warning (`--signal=B:USR1@120`) and saves when
    `guard.stop_requested` turns true; a job that was warned and saved needs only its continuation.
    Severity: always a warning. The run is not wrong, it is unfinished: its state (`cut-off`) and the exit
    code of `trainguard run` (121; 0 for a warned run that saved and stopped by itself) say so, and the
    summary says what was lost.
    """
    return Finding.of(CUT_BY_SCHEDULER, step=step, t=t, source=source, cause=cause, summary=summary,
                      evidence=evidence, fix=fix)


CUT_BY_SCHEDULER = Code("TG552", "cut-by-scheduler", "warning", needs=(PROCESS,), page=cut_by_scheduler,
                        since="0.2.0")


def node_lost(*, summary: str, evidence: dict[str, Any], fix: str, where: str | None, cause: str, step: int | None = None,
              t: float | None = None, source: str = "watchdog") -> Finding:
    """TG711 node-lost: a node of the job went away while the run trained.

    ## What it detects
    - Under torchrun over several nodes, each node's `trainguard run` writes a beat into the job's
      rendezvous store (torchrun's c10d TCPStore) every 2 s. A node whose beat stopped changing for 20 s
      without saying its part ended is lost: its agent and watchdog were killed, or its machine went away.
    - Under Slurm, a node of the job that Slurm says failed when the scheduler's signal came (`scontrol show
      node`: DOWN, FAIL, not responding; `sacct`: NODE_FAIL), named with Slurm's own reason.
    - In a log (`trainguard diagnose`): slurmstepd's `*** JOB 4182 ON node07 CANCELLED AT ... DUE TO NODE
      FAILURE ***` (LSF's `TERM_HOST`).

    ## Why it matters
    The ranks of the surviving nodes fail next ("Connection closed by peer", a timeout) or wait in a
    collective forever; their errors are consequences, and the cause is on the lost node, which may have
    left no record of its own (a node killed by the scheduler, an out-of-memory kill of the whole job step).

    ## Example
    node 1 (host gpu-b) lost: no beat for 24 s through the store at 10.0.0.1:29400; last at step 37.
    job 4182 lost node tgn2 (Slurm says tgn2: DOWN, reason "Not responding"); this part was ended (SIGTERM).

    ## What to change
    Look at why that node went away: the scheduler's reason (`scontrol show node NAME`, `sacct -j JOBID
    --format=NodeList,State,Reason`), the kernel log (the OOM killer), its own run folder (`RUN/node-1/`).
    Restart from the last checkpoint, excluding the node (`sbatch --exclude=NAME`); torchrun's
    `--max-restarts` with an elastic `--nnodes=MIN:MAX`, or Slurm's `--requeue`, lets the job go on.

    ## Known false positives
    A watchdog stopped for a long time (SIGSTOP, a frozen machine that comes back) looks lost.
    """
    return Finding.of(NODE_LOST, step=step, t=t, source=source, cause=cause, where=where, summary=summary,
                      evidence=evidence, fix=fix)


NODE_LOST = Code("TG711", "node-lost", "error", needs=(NODES,), page=node_lost, status="preview")
