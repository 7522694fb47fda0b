"""The preflight's rules over its starts of the script (TG601-TG609): a periodic path that crashed when
brought forward, never runs or dominates the run; a second epoch or a resume that failed; files written
outside the scratch folder; a start that ran out of time. Each builds its finding from plain data;
preflight/judge.py decides which apply.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainguard.findings import PREFLIGHT, Code, Finding
from trainguard.preflight.schedule import fmt_duration


def _message(crash: Finding) -> str:
    """The exception's message; for an error re-raised from a DataLoader worker, the original one."""
    msg = str(crash.evidence.get("message", ""))
    if "Original Traceback" in msg:
        lines = [ln for ln in msg.splitlines() if ln.strip()]
        return f"{lines[-1].strip()} (in a DataLoader worker)" if lines else msg
    return msg


def _crash_evidence(crash: Finding) -> dict[str, Any]:
    ev: dict[str, Any] = {k: crash.evidence.get(k) for k in ("exception", "message", "frames", "phase") if k in crash.evidence}
    ev["where"] = crash.where
    return ev


def path_crashed(forced: dict[str, Any], crash: Finding) -> Finding:
    """TG601 periodic-path-crashed: a path the script runs every N steps crashed when preflight ran it early.

    ## What it detects
    Preflight answers every `guard.due(name, every=N)` True once, after a few real
    steps, so the gated path (evaluation, checkpoint saving, sample generation...) runs in the first
    seconds with the real step counter and the real dtype and autocast state. This finding names the
    path that crashed, the step the real run would first have reached it at, and the exception.

    ## Why it matters
    Seed 001 crashed at step 1999, in its first evaluation, on `None % 500`; seed 004
    trained 12,500 steps and died in its evaluation on a dtype mismatch autocast had hidden during
    training. Each cost every step before the crash.

    ## Example
    The 'eval' path (every 2000 steps, first run at step 2000) crashed at preflight step 3:
    TypeError: unsupported operand type(s) for %: 'NoneType' and 'int', at train.py:15 (forward).

    ## What to change
    Fix the code at `where`; the fix line names the usual cause of the exception.

    ## Known false positives
    A path that only works after many steps by design (e.g. it reads a file an
    earlier path writes): make it check for what it needs.

    ## Options
    `trainguard preflight --steps N`: real steps before the paths are brought forward (default 4).
    """
    name, every, step = forced["name"], forced["every"], forced["step"]
    first_real = every if every and every > 0 else None
    real = f"first run at step {first_real}" if first_real else "first run later in the run"
    return Finding.of(
        PERIODIC_PATH_CRASHED, step=step,
        summary=(f"the '{name}' path (every {every} steps, {real} of the real run) crashed when preflight"
                 f" brought it forward to step {step}: {crash.exception}: {_message(crash)}"[:400]),
        evidence={"path": name, "every": every, "real_first_step": first_real, "preflight_step": step,
                  **_crash_evidence(crash)},
        fix=crash.fix, cause=crash.cause, where=crash.where, exception=crash.exception, source="preflight",
    )


PERIODIC_PATH_CRASHED = Code("TG601", "periodic-path-crashed", "error", needs=(PREFLIGHT,),
                             page=path_crashed, status="preview")


def second_epoch_failed(first: dict[str, Any], crash: Finding) -> Finding:
    """TG603 second-epoch-failed: the training data loader fails when it is iterated a second time.

    ## What it detects
    Preflight ends the first training pass over the loader after a few steps, so the
    script crosses its epoch boundary and iterates the loader again, with its real `num_workers`; the
    new iteration raised before yielding its first batch.

    ## Why it matters
    A loader that works once and fails on its second pass (an exhausted generator or
    file handle, a sampler whose state is not reset, workers that cannot be restarted) lets the whole
    first epoch run, often hours, before the crash.

    ## Example
    The loader's second iteration raised RuntimeError: stream already consumed at step 3,
    data.py:21 (__iter__); the real run would reach it at step 1250 (end of epoch 1).

    ## What to change
    Make `__iter__` start a fresh pass each time (reopen files, recreate generators);
    with `persistent_workers=True`, make the dataset's state safe to reuse.

    ## Known false positives
    None known; a loader meant to be iterated once should not be looped over.

    ## Options
    None.
    """
    cut: dict[str, Any] = next((e["data"] for e in first["events"] if e["name"] in ("epoch-cut", "epoch-end")), {})
    per_epoch = cut.get("len")
    accum = first["plan"].get("grad_accum") or 1
    real = f"; the real run would reach it at step {per_epoch // accum} (end of epoch 1)" if per_epoch else ""
    return Finding.of(
        SECOND_EPOCH_FAILED, step=crash.step,
        summary=(f"the training data loader failed when iterated for the second epoch: {crash.exception}:"
                 f" {_message(crash)}"[:300] + real),
        evidence={"loader": cut.get("type"), "batches_per_epoch": per_epoch, **_crash_evidence(crash)},
        fix=("Make the loader's __iter__ start a fresh pass each time it is called (reopen files, recreate"
             " generators, reset sampler state)."),
        cause=crash.cause, where=crash.where, exception=crash.exception, source="preflight",
    )


SECOND_EPOCH_FAILED = Code("TG603", "second-epoch-failed", "error", needs=(PREFLIGHT,),
                           page=second_epoch_failed, status="preview")


def resume_failed(resume: dict[str, Any], checkpoint: str) -> Finding:
    """TG602 checkpoint-resume-failed: the script cannot resume from the checkpoint it saved itself.

    ## What it detects
    Preflight brings the save path forward, takes the checkpoint the script reported
    with `guard.checkpoint_saved(path)`, and starts the script a second time with
    TRAINGUARD_RESUME_FROM set (`guard.resume_from`), so the script's own resume code runs; that start
    crashed (or hung).

    ## Why it matters
    A checkpoint that saves but cannot be loaded is found at the worst moment, after a
    crash, when the hours it should have saved are already lost. Common causes: a wrapped model
    (`DistributedDataParallel`, `torch.compile`) saved with `module.` or `_orig_mod.` prefixed keys and
    loaded into the bare model; an object in the checkpoint that `torch.load(weights_only=True)`
    refuses (a config class, a lambda).

    ## Example
    RuntimeError: Error(s) in loading state_dict for Net: Missing key(s) "lin.weight",
    Unexpected key(s) "module.lin.weight", at train.py:31, resuming from scratch/ckpt/step3.pt.

    ## What to change
    Save `model.module.state_dict()` (or strip the prefix when loading); keep only
    tensors and plain containers in a checkpoint (store configs as dicts).

    ## Known false positives
    None known.

    ## Options
    None: the resumed start makes 2 optimizer steps.
    """
    crash = next((f for f in resume["findings"] if f.severity == "error"), None)
    detail = f"{crash.exception}: {_message(crash)}" if crash and crash.exception else (
        crash.summary if crash else f"the resumed start ended {resume['state']}")
    return Finding.of(
        CHECKPOINT_RESUME_FAILED, step=crash.step if crash else None,
        summary=f"resuming from the checkpoint the script saved ({Path(checkpoint).name}) failed: {detail}"[:400],
        evidence={"checkpoint": checkpoint, "resume_state": resume["state"],
                  **(_crash_evidence(crash) if crash else {})},
        fix=("Load what you save: save the unwrapped model's state_dict (model.module / model._orig_mod), keep"
             " only tensors and plain containers in the checkpoint, and load it the way the resume code does."),
        cause=crash.cause if crash else None, where=crash.where if crash else None,
        exception=crash.exception if crash else None, source="preflight",
    )


CHECKPOINT_RESUME_FAILED = Code("TG602", "checkpoint-resume-failed", "error", needs=(PREFLIGHT,),
                                page=resume_failed, status="preview")


def path_never_runs(name: str, every: int, total: int) -> Finding:
    """TG606 periodic-path-never-runs: a path is due every N steps, but the run is shorter than N.

    ## What it detects
    `guard.due(name, every=N)` with N larger than the planned `total_steps`.

    ## Why it matters
    The evaluation never happens (no metric, no early stopping, no best model) or the
    checkpoint is never written, and nobody notices until the run is over.

    ## Example
    The 'eval' path runs every 5000 steps but the run has 1000 steps: it never runs.

    ## What to change
    Make the interval at most the run's length (e.g. total_steps // 5), or compute it
    from the run's length.

    ## Known false positives
    A path meant to run only in longer runs.

    ## Options
    None.
    """
    return Finding.of(
        PERIODIC_PATH_NEVER_RUNS,
        summary=f"the '{name}' path runs every {every} steps but the run has {total} steps: it never runs",
        evidence={"path": name, "every": every, "total_steps": total},
        fix=f"Use an interval of at most {total} steps (e.g. every={max(1, total // 5)}).", source="preflight",
    )


PERIODIC_PATH_NEVER_RUNS = Code("TG606", "periodic-path-never-runs", "error", needs=(PREFLIGHT,),
                                page=path_never_runs, status="preview")


def path_dominates(name: str, every: int, secs: float, path_total: float, train_total: float) -> Finding:
    """TG607 periodic-path-dominates: a periodic path would take longer than the training itself.

    ## What it detects
    The time the path took when preflight brought it forward, times the number of times
    the plan runs it, exceeds the estimated training time (steps × the measured time per step).

    ## Why it matters
    An evaluation every 10 steps on a large eval set turns a 2-hour run into a 10-hour one.

    ## Example
    'eval' took 4.2 s; run 500 times (every 10 of 5000 steps) that is 35 min, against 12 min of
    training.

    ## What to change
    Evaluate less often, or on a subset of the eval set.

    ## Known false positives
    The first run of a path pays one-time costs (compilation, caching), so the
    estimate can be high; rerun the preflight with a warm cache to confirm.

    ## Options
    None: the path is flagged when its planned total time exceeds the training time.
    """
    return Finding.of(
        PERIODIC_PATH_DOMINATES,
        summary=(f"the '{name}' path took {secs:.2f} s; run every {every} steps it would take"
                 f" {fmt_duration(path_total)}, more than the training itself ({fmt_duration(train_total)})"),
        evidence={"path": name, "every": every, "seconds_per_run": round(secs, 3),
                  "path_total_s": round(path_total, 1), "train_total_s": round(train_total, 1)},
        fix=f"Run '{name}' less often or on a subset.", source="preflight",
    )


PERIODIC_PATH_DOMINATES = Code("TG607", "periodic-path-dominates", "warning", needs=(PREFLIGHT,),
                               page=path_dominates, status="preview")


def wrote_outside(writes: list[dict[str, str]], first: dict[str, Any]) -> Finding:
    """TG608 wrote-outside-scratch: the preflight's script wrote files outside its scratch folder.

    ## What it detects
    Preflight runs the script in a scratch folder of symlinks to the user's files and
    turns each symlink into a private copy before the script writes to it; a write to any other place
    (an absolute path, a parent folder, a file written by native code) is listed here.

    ## Why it matters
    A preflight checkpoint written to the real checkpoint folder would make the real run
    resume from a 3-step model; a results file written there would look like a real run's.

    ## Example
    /data/ckpt/last.pt (written), /home/me/project/results.json (created).

    ## What to change
    Delete the files listed before the real run; let the script write relative to its
    working folder (or to a folder given by an option), so the preflight keeps its writes to itself.

    ## Known false positives
    None known; files in temp and cache folders are not flagged (they are listed in
    preflight.json).

    ## Options
    None.
    """
    ckpts = {c.get("path") for c in first["checkpoints"]}
    resumable = [w["path"] for w in writes if w["path"] in ckpts and w["op"] != "refused"]
    written = [w for w in writes if w["op"] != "refused"]
    refused = [w for w in writes if w["op"] == "refused"]
    shown = ", ".join(f"{w['path']} ({w['op']})" for w in written[:5])
    more = f" and {len(written) - 5} more" if len(written) > 5 else ""
    note = "; it includes a checkpoint the real run could resume from" if resumable else ""
    parts = [f"the preflight wrote {len(written)} file(s) outside its scratch folder: {shown}{more}{note}"] \
        if written else []
    if refused:
        parts.append(f"the preflight refused {len(refused)} write(s) to files that existed before (left unchanged): "
                     + ", ".join(w["path"] for w in refused[:5]) + (" ..." if len(refused) > 5 else ""))
    fix = "Make the script write relative to its working folder, so the preflight keeps its writes to itself"
    fix = (f"Delete the new files listed (they did not exist before the preflight); {fix[0].lower()}{fix[1:]}."
           if written else f"Nothing to delete: no file of yours was changed. {fix}.")
    return Finding.of(
        WROTE_OUTSIDE_SCRATCH,
        summary="; ".join(parts),
        evidence={"files": writes[:100], "checkpoints_outside": resumable},
        fix=fix,
        source="preflight",
    )


WROTE_OUTSIDE_SCRATCH = Code("TG608", "wrote-outside-scratch", "warning", needs=(PREFLIGHT,),
                             page=wrote_outside, status="preview")


class TimeLimit:
    """A Supervisor monitor: one start of the script may take at most `seconds`."""

    def __init__(self, seconds: float, mode: str) -> None:
        self.seconds, self.mode, self.fired = seconds, mode, False

    def poll(self, state: Any) -> list[Finding]:
        if self.fired or state.now - state.started < self.seconds:
            return []
        self.fired = True
        return [timed_out(self.seconds, self.mode, state.step)]


def timed_out(seconds: float, mode: str, step: int | None) -> Finding:
    """TG609 preflight-timed-out: a start of the script did not finish its fast-forward in time.

    ## What it detects
    A start of the script ran longer than `--timeout` seconds; the preflight stopped it.

    ## Why it matters
    The fast-forward should take seconds; a script that never calls `trainguard.watch`
    (nothing to fast-forward), a loop that never asks `guard.due`, or a path that hangs keeps running.

    ## Example
    The first start ran 600 s and reached step 12.

    ## What to change
    Use `trainguard.watch(...)` and `guard.due(...)`/`guard.batches(...)` in the loop, or
    look at the hang findings of the start's run folder.

    ## Known false positives
    A very slow first step (a huge model on a small machine): raise --timeout.

    ## Options
    `trainguard preflight --timeout S` (default 600 s per start of the script).
    """
    return Finding.of(
        PREFLIGHT_TIMED_OUT, step=step,
        summary=f"the {mode} start of the script ran longer than {seconds:g} s and was stopped",
        evidence={"timeout_s": seconds, "mode": mode, "step": step},
        fix="Make sure the script calls trainguard.watch() and guard.due()/guard.batches(); or raise --timeout.",
        source="preflight",
    )


PREFLIGHT_TIMED_OUT = Code("TG609", "preflight-timed-out", "error", needs=(PREFLIGHT,),
                           page=timed_out, status="preview")
