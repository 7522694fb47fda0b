"""`trainguard preflight`: the user's own script, fast-forwarded through its rare paths in about a minute.

    trainguard preflight [--run-dir DIR] [--steps N] -- python train.py --config cfg.yaml

1. The script runs under the watchdog (the same Supervisor as `trainguard run`) in a scratch folder,
   with TRAINGUARD_PREFLIGHT set: a few real steps, then every `guard.due(...)` path brought forward,
   the epoch boundary crossed, the LR schedule simulated for the whole plan; the probe then stops it
   with exit 0 (probe/fastforward.py).
2. When the script reported a checkpoint (`guard.checkpoint_saved`), it is started a second time,
   briefly, with TRAINGUARD_RESUME_FROM pointing at it, so its own resume code runs.
3. The findings (judge.py) and the estimates go to RUN/status.json and RUN/preflight.json; the verdict
   is the exit code: 0 no error finding, 1 with one.

RUN/ holds scratch/ (the working folder), start-1/ and start-2-resume/ (each start's own run folder) and
schedule.json (the simulated LR curve).

Under torchrun every rank is fast-forwarded in lockstep (probe/lockstep.py: rank 0 decides, the others
read its answers from the job's store), so no rank is left alone in a collective.

Limits, stated plainly: writes by Python and by torch.save / safetensors are kept in the scratch
folder, other native writers are only reported afterwards (the user's folder is compared before and
after); only paths gated by `guard.due` are brought forward (`if step % 500 == 0` is invisible to it).

A script that never calls `trainguard.watch` cannot be fast-forwarded: the automatic probe (the same
bootstrap as `trainguard run`'s) runs a few real optimizer steps, simulates the schedule it observed
where the scheduler states its horizon, and stops the script; the report lists what was and was not
exercised, and the verdict is `incomplete`, exit code 3 (1 when there are error findings), never 0.
The same holds for a watched script whose LR moved but could not be simulated (a scheduler without a step
count, an LR set by hand inline that no function of the script reproduces): the schedule is listed as
not checked and the verdict is `incomplete`, exit 3. A constant LR with no scheduler has nothing to check.
Writes that would change a file that existed before, outside the scratch folder, are refused.
"""

from __future__ import annotations

import json
import resource
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainguard import exitcodes
from trainguard.contract import ENV_PREFLIGHT, ENV_RESUME_FROM
from trainguard.errors import UserError
from trainguard.findings import Finding, most_severe_first
from trainguard.folderio import read_capped, regular_or_missing, write_atomic
from trainguard.preflight import judge, scratch
from trainguard.preflight.runrules import PREFLIGHT_TIMED_OUT, TimeLimit
from trainguard.probe.fastforward import SCHEDULE_FILE
from trainguard.store.ending import Ending, ending_status
from trainguard.store.paths import new_run_dir, prepare_run_dir, runs_root
from trainguard.store.status import write_status
from trainguard.untrusted import printable

if TYPE_CHECKING:
    from trainguard.contract import PreflightOutcome

RESUME_STEPS = 2  # optimizer steps the resumed start makes before it is stopped
EXIT_INCOMPLETE = exitcodes.PREFLIGHT_INCOMPLETE  # the script could not be fast-forwarded: what could not be checked is listed


@dataclass(kw_only=True)
class PreflightOptions:
    command: list[str]
    """The user's command, unmodified."""
    run_dir: str | None = None
    """The preflight's folder (default: a new one under ./trainguard-runs)."""
    steps: int = 4
    """Real optimizer steps before the periodic paths are brought forward."""
    timeout: float = 600.0
    """Seconds each start of the script may take before the preflight gives up on it."""
    echo: bool = True
    """Echo the script's output."""


def preflight(opts: PreflightOptions) -> int:
    if opts.steps < 2:
        raise UserError(f"--steps must be at least 2 (the schedule is measured between real steps), got {opts.steps}")
    if not opts.command:
        raise UserError("no command given: trainguard preflight [OPTIONS] -- COMMAND [ARGS...]")
    from trainguard.watchdog.supervisor import check_command

    check_command(opts.command)  # bad input fails here, before any folder is made
    origin = Path.cwd()
    run_dir = prepare_run_dir(opts.run_dir) if opts.run_dir else new_run_dir(f"preflight-{_label(opts.command)}")
    run_dir = run_dir.resolve()
    _clear_previous(run_dir)
    avoid = [run_dir, runs_root().resolve()]
    work = scratch.build_scratch(origin, run_dir / "scratch", avoid)
    before, complete = scratch.snapshot(origin, avoid)
    t0 = time.time()

    first = _start(opts, run_dir / "start-1", work, mode="first", steps=opts.steps)
    starts = [first]
    resume: dict[str, Any] | None = None
    ckpt = judge.last_checkpoint(first)
    if first["state"] == "completed" and ckpt:
        resume = _start(opts, run_dir / "start-2-resume", work, mode="resume", steps=RESUME_STEPS,
                        env={ENV_RESUME_FROM: ckpt})
        starts.append(resume)

    after, complete_after = scratch.snapshot(origin, avoid)
    sched_path = first["dir"] / SCHEDULE_FILE
    sim = json.loads(read_capped(sched_path, 64 << 20, "schedule.json")) if regular_or_missing(sched_path) else None
    if sim is not None:
        write_atomic(run_dir / SCHEDULE_FILE, json.dumps(sim))
    writes = _unique(scratch.outside_writes([s["dir"] for s in starts]) + scratch.changed(before, after))
    own = scratch.own_output_files()
    writes = [w for w in writes if not scratch.is_own_output(w["path"], own)]
    writes = scratch.without_fresh_temp(writes)
    findings = judge.judge(first, resume, sim, writes, origin=str(origin.resolve()))
    summary = judge.summarize(first, resume, sim, ckpt, writes, peak_rss=_peak_rss())
    summary.update({"seconds": round(time.time() - t0, 1), "snapshot_complete": complete and complete_after,
                    "scratch": str(work), "origin": str(origin)})
    findings += _against_the_job(summary)
    return _conclude(run_dir, opts, findings, summary)


def _against_the_job(summary: dict[str, Any]) -> list[Finding]:
    """Under Slurm: the whole plan at the preflight's measured pace (evaluations and saves included) against
    the time the job has left (TG551); nothing outside a scheduler or without an estimate."""
    from trainguard.watchdog import joblimit, slurm

    job = slurm.job_from_env()
    estimate, total = summary.get("seconds_total_estimate"), summary.get("total_steps")
    if job is None or not estimate or not total:
        return []
    summary["scheduler"] = {"name": "slurm", **job.to_dict()}
    found = joblimit.plan_exceeds_time_limit(job, step=0, total=int(total), rate=float(estimate) / int(total),
                                             now=time.time(), checkpoints=[], source="preflight")
    return [found] if found is not None else []


def _clear_previous(run_dir: Path) -> None:
    """A reused --run-dir: remove what an earlier preflight left (only its own names), so stores never mix."""
    for name in ("start-1", "start-2-resume", "scratch"):
        if (run_dir / name).is_dir() and not (run_dir / name).is_symlink():
            shutil.rmtree(run_dir / name)  # the scratch folder's symlinks are removed, never followed
    for name in ("status.json", SCHEDULE_FILE, "preflight.json"):
        (run_dir / name).unlink(missing_ok=True)


def _unique(writes: list[dict[str, str]]) -> list[dict[str, str]]:
    seen: dict[str, dict[str, str]] = {}
    for w in writes:
        seen.setdefault(w["path"], w)
    return list(seen.values())


def _start(opts: PreflightOptions, start_dir: Path, work: Path, *, mode: str, steps: int,
           env: dict[str, str] | None = None) -> dict[str, Any]:
    """One start of the script under the Supervisor; returns its status and what the probe recorded."""
    from trainguard.watchdog.supervisor import RunOptions, Supervisor

    what = "fast-forward" if mode == "first" else f"resuming from {env and env.get(ENV_RESUME_FROM)}"
    print(f"trainguard preflight: start {1 if mode == 'first' else 2} ({what}) in {work}", file=sys.stderr)
    cfg = {"mode": mode, "steps": steps, "scratch": str(work), "origin": str(Path.cwd())}
    from trainguard.probe.auto import bootstrap_env

    # the bootstrap: the write watch from the first line on, and the automatic probe for a script without
    # trainguard.watch (a few real optimizer steps, then stopped)
    options = RunOptions(command=list(opts.command), run_dir=str(start_dir), echo=opts.echo, live=False,
                         stop_on=[PREFLIGHT_TIMED_OUT.name], cwd=str(work),
                         env={**bootstrap_env(), ENV_PREFLIGHT: json.dumps(cfg), **(env or {})})
    sup = Supervisor(options, monitors=[TimeLimit(opts.timeout, mode)])
    code = sup.run()
    return judge.load_start(start_dir, mode=mode, exit_code=code, scratch=str(work), origin=str(Path.cwd()))


def _conclude(run_dir: Path, opts: PreflightOptions, findings: list[Finding], summary: dict[str, Any]) -> int:
    findings = most_severe_first(findings)
    errors = [f for f in findings if f.severity == "error"]
    # a script that could not be fast-forwarded was not checked: never "passed", never exit 0
    # so is a fast-forwarded script whose LR moved in a way the preflight could not simulate
    unchecked = not summary.get("fast_forward", True) or summary.get("schedule_checked") is False
    outcome: PreflightOutcome = "failed" if errors else "incomplete" if unchecked else "passed"
    code = exitcodes.FINDINGS if errors else EXIT_INCOMPLETE if unchecked else 0
    status = ending_status(Ending(preflight=outcome, exit_code=code), command=opts.command, updated=time.time(),
                           ended=time.time(), watched_by="preflight", preflight=summary,
                           findings=[f.to_dict() for f in findings])
    write_status(run_dir, status)
    write_atomic(run_dir / "preflight.json", json.dumps(summary, indent=2, default=str))  # never via a link
    for line in judge.report_lines(outcome, findings, summary, run_dir):
        print(printable(line), file=sys.stderr)
    return code


def _peak_rss() -> int | None:
    """Peak resident memory of the largest start of the script (its process tree's biggest member)."""
    try:
        kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        return int(kb) * 1024 if sys.platform != "darwin" else int(kb)
    except (OSError, ValueError):
        return None


def _label(command: list[str]) -> str:
    if Path(command[0]).name.startswith("python") and len(command) > 1:
        return command[2].rsplit(".", 1)[-1] if command[1] == "-m" and len(command) > 2 else Path(command[1]).stem
    return Path(command[0]).name
