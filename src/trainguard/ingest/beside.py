"""What else a run folder says about how its run ended, beside the metrics its reader read.

Two things a metrics artifact cannot show on its own:

- The job scheduler's output files (`slurm-12345.out`, `%x-%j.err`: Slurm's `--output`/`--error`, written in
  the submission folder, often the run folder). An artifact (`trainer_state.json`, event files, a results
  table) merely stops; the scheduler's `slurmstepd: error: *** JOB 123 ON node CANCELLED AT ... DUE TO TIME
  LIMIT ***`, the OOM killer's line or a traceback there says why. Each is read by the text-log reader
  (its failure signatures, rules off) and its ending decides the run's state over an artifact that stops.
- A YOLO run folder whose run never finished an epoch. Ultralytics' `BaseTrainer.__init__` saves
  `args.yaml` and makes the empty `weights/` at start; `results.csv` gets its first row in `save_metrics`
  at the end of the first epoch (after validation), and `weights/last.pt` right after it. YOLOv5's and
  YOLOv7's `train()` write `opt.yaml` and `hyp.yaml` first and append `results.csv` / `results.txt` at each
  epoch's end the same way. A plan file with no table and no saved weights is a run that died (or is still)
  in its first epoch.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from trainguard.findings import Finding, most_severe_first
from trainguard.ingest.diagnose import Diagnosis, _with_plan_fraction
from trainguard.ingest.signs import LOG_ENDS_UNFINISHED, STILL_WRITING

# the scheduler's output files: Slurm's default `slurm-%j.out` and the `--output/--error` names people give
SIDE_SUFFIXES = (".out", ".err")
MAX_SIDE_LOGS = 8  # the newest ones; an array job's folder may hold hundreds
FAILED = ("crashed", "killed", "cut-off", "launch-failed")

# (contract, the table its writer appends at each epoch's end) for the YOLO run folders
EPOCH_TABLES = (("ultralytics results.csv", "results.csv"), ("yolov5 results.csv", "results.csv"),
                ("yolov7 results.txt", "results.txt"))


def side_logs(folder: Path, main: Path | None) -> list[Path]:
    """The scheduler's output files directly in the folder (not the file the run was read from), newest last."""
    try:
        found = [p for p in folder.iterdir() if p.suffix in SIDE_SUFFIXES and p.is_file() and not p.is_symlink()
                 and p != main]
        found.sort(key=lambda p: (p.stat().st_mtime, p.name))
    except OSError:
        return []
    return found[-MAX_SIDE_LOGS:]


def with_side_logs(d: Diagnosis, folder: Path) -> Diagnosis:
    """The diagnosis with what the scheduler's output files beside it say about the ending: a failure there
    (a cut, a kill, a traceback) decides the state of a run its artifact does not show completed, and replaces
    the artifact's own "it stops" finding (keeping how far into its plan it got)."""
    from trainguard.errors import UserError
    from trainguard.ingest.diagnose import diagnose_path

    endings: list[tuple[Path, Diagnosis]] = []
    for log in side_logs(folder, d.path if d.path != folder else None):
        try:
            side = diagnose_path(log, rules=False)
        except UserError:  # an empty .err, a file that is no log: it says nothing about the ending
            continue
        if side.state in FAILED or (side.state == "completed" and d.state == "unknown"):
            endings.append((log, side))
    if not endings:
        return d
    log, side = next(((p, s) for p, s in reversed(endings) if s.state in FAILED), endings[-1])
    ending = [f for f in side.findings if f.code != LOG_ENDS_UNFINISHED.code]
    note = f"how the run ended was read from {log.name} beside it (the scheduler's output)"
    if side.state == "completed" or d.state == "completed":
        if d.state == "completed":  # the training finished; the job failed after it (a final save, an upload)
            ending = [replace(f, severity="warning", summary=f"after the training completed: {f.summary}")
                      for f in ending]
        return replace(d, state="completed", findings=most_severe_first(d.findings + ending),
                       notes=d.notes + [note])
    stops = [f for f in d.findings if f.code == LOG_ENDS_UNFINISHED.code]
    reached = next((f.evidence.get("cut_off") for f in stops if f.evidence.get("cut_off")), None)
    ending = [_with_plan_fraction(f, reached) for f in ending]
    kept = [f for f in d.findings if f.code != LOG_ENDS_UNFINISHED.code]
    return replace(d, state=side.state, findings=most_severe_first(kept + ending), notes=d.notes + [note])


def scheduler_log(folder: Path, now: float | None = None, alive: bool = False) -> Diagnosis | None:
    """A folder that holds nothing but the scheduler's output files: the newest `.out` (else `.err`) is the run's
    log (the others, read by `with_side_logs`, may still say how it ended). None when there is none or it
    holds nothing readable."""
    from trainguard.errors import UserError
    from trainguard.ingest.diagnose import diagnose_path

    logs = side_logs(folder, None)
    ordered = [p for p in reversed(logs) if p.suffix == ".out"] + [p for p in reversed(logs) if p.suffix == ".err"]
    for log in ordered[:2]:
        try:
            return diagnose_path(log, now=now, alive=alive)
        except UserError:
            continue
    return None


def before_first_epoch(folder: Path, now: float | None = None, alive: bool = False) -> Diagnosis | None:
    """A YOLO run folder with its plan file but no epoch table yet: a run that never finished an epoch.
    None when the folder is no such thing; UserError when it says otherwise (saved weights: an epoch did end).
    """
    from trainguard.errors import UserError
    from trainguard.ingest.formats import contract
    from trainguard.ingest.plans import read_plan

    for name, table in EPOCH_TABLES:
        c = contract(name)
        plan = read_plan(folder, c)
        if c is None or plan.source is None:
            continue
        if any((folder / t).exists() for _, t in EPOCH_TABLES):
            return None  # the table is there but unreadable: its reader's word stands
        weights = folder / "weights"
        saved = sorted(p.name for p in weights.iterdir() if p.suffix in (".pt", ".pkl")) if weights.is_dir() else []
        if saved:  # an epoch ended and was saved (after its row), but the table is gone: nothing to judge it by
            raise UserError(f"{folder}: {c.family} run folder whose weights/{saved[0]} shows an epoch ended, "
                            f"but its {table} is missing (moved or deleted?): nothing here says how the run went")
        return _no_epoch(folder, c.family, plan, table, now=now, alive=alive)
    return None


def _no_epoch(folder: Path, family: str, plan: Any, table: str, *, now: float | None, alive: bool) -> Diagnosis:
    planned = f"{plan.source} plans {plan.length} epochs" if plan.length else f"{plan.source} states its settings"
    batches = sorted(p.name for p in folder.glob("train_batch*.jpg"))
    evidence: dict[str, Any] = {"plan_file": plan.source, "planned_epochs": plan.length, "table": table,
                                "epochs_finished": 0}
    summary = (f"{folder.name}: the run never finished an epoch: {planned}, but no {table} was written "
               f"({family} writes its first row at the end of the first epoch, after validation)")
    if batches:  # the writers plot their first training batches: training had begun
        summary += f"; it had started training ({batches[0]} is plotted from its first batches)"
        evidence["plotted"] = batches[:3]
    severity, cause = "warning", "no-epoch"
    if alive:  # asked whether it may still be going: the folder's newest write says
        now = time.time() if now is None else now
        newest = max((p.stat().st_mtime for p in folder.iterdir() if p.is_file()), default=None)
        if newest is not None:
            evidence["seconds_since_last_write"] = round(now - newest, 1)
            if now - newest < STILL_WRITING:
                severity, cause = "info", "still-writing"
                summary += " (written in the last two minutes: it may still be in its first epoch)"
    finding = Finding.of(
        LOG_ENDS_UNFINISHED, severity=severity, cause=cause, step=None, summary=summary, evidence=evidence,
        source="diagnose",
        fix="find out how the process ended before its first epoch did (its console, dmesg for the OOM killer, "
            "the scheduler's slurm-*.out); a first epoch that takes longer than the job's time limit needs "
            "more time, a smaller dataset fraction (fraction=) or a smaller image size to check the setup first")
    if plan.length:
        evidence["cut_off"] = f"epoch 0 of {plan.length} (0%)"
    return Diagnosis(path=folder, format=f"{family} run folder ({plan.source}, no {table} yet)",
                     state="unfinished", findings=[finding])
