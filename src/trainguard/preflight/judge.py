"""What a preflight found: its findings, its estimates and the lines it prints.

The inputs are plain: each start's status.json and run store (what the watchdog and the probe wrote),
the simulated schedule and the list of files written outside the scratch folder. Every finding here
names the path, the step the real run would have reached it at, and the preflight step it failed at.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

from trainguard.findings import PREFLIGHT, Code, Finding
from trainguard.preflight.schedule import fmt_duration, schedule_findings
from trainguard.preflight.scratch import is_temporary
from trainguard.rules.crash import RUN_CRASHED
from trainguard.store.reader import RunReader
from trainguard.store.status import read_status

DOMINATES = 1.0  # a periodic path that would take longer than the training itself is flagged


def load_start(start_dir: Path, *, mode: str, exit_code: int, scratch: str, origin: str) -> dict[str, Any]:
    """One start's status, preflight events, checkpoints, step times and plan, as plain data.

    Paths into the scratch folder (a crash's `where` and frames) are shown as the user's own files, which
    the scratch folder's symlinks point at.
    """
    try:
        status = read_status(start_dir)
    except Exception:
        status = {}
    status = _renamed(status, scratch.rstrip("/") + "/", origin.rstrip("/") + "/")
    with RunReader(start_dir) as reader:
        # under torchrun every rank fast-forwards in lockstep: rank 0's record decides, the others' stops
        # show that each rank was exercised and stopped at the same step
        every_rank = reader.events("preflight")
        events = [e for e in every_rank if e["rank"] == 0]
        starts = [e.get("data") or {} for e in reader.events("probe") if e["name"] == "start"]
        rows = list(reader.steps(rank=0))
        step_times = [(r["step"], r["step_time"]) for r in rows if r.get("step_time")]
        if not step_times and len(rows) > 1:
            # the automatic probe closes no loss side (no guard.step): a step's time is the gap between rows
            step_times = [(b["step"], b["t"] - a["t"]) for a, b in zip(rows, rows[1:]) if a.get("t") and b.get("t")]
        return {
            "probe": None if not starts else "auto" if all(d.get("auto") for d in starts) else "watch",
            "opt_steps": len(rows),
            "dir": start_dir, "mode": mode, "exit_code": exit_code, "state": status.get("state", "unknown"),
            "findings": [Finding.from_dict(f) for f in status.get("findings") or []],
            "events": events,
            # steps after which a phase other than training began: the next step's time holds that phase
            "other_phase_steps": sorted({e["step"] for e in reader.events("phase")
                                         if e["name"] != "train" and (e.get("data") or {}).get("edge") == "begin"
                                         and isinstance(e.get("step"), int)}),
            "checkpoints": [e["data"] for e in reader.events("checkpoint") if e.get("data")],
            "step_times": step_times,
            "plan": reader.meta().get("plan") or {},
            "crash_event_id": max((e["id"] for e in reader.events("crash")), default=None),
            "ranks": _rank_stops(every_rank),
        }


def _rank_stops(events: list[dict[str, Any]]) -> dict[str, Any]:
    """Each rank's preflight: the paths brought forward on it and the step it stopped at (None: it did not)."""
    out: dict[str, Any] = {}
    for e in events:
        r = out.setdefault(str(e["rank"]), {"forced": [], "stopped_at": None})
        if e["name"] == "forced":
            r["forced"].append((e.get("data") or {}).get("name"))
        elif e["name"] == "stop":
            r["stopped_at"] = (e.get("data") or {}).get("step")
    return out


def _renamed(value: Any, old: str, new: str) -> Any:
    if isinstance(value, str):
        return value.replace(old, new)
    if isinstance(value, list):
        return [_renamed(v, old, new) for v in value]
    if isinstance(value, dict):
        return {k: (v if k in ("checkpoint", "path") else _renamed(v, old, new)) for k, v in value.items()}
    return value


def last_checkpoint(start: dict[str, Any]) -> str | None:
    paths = [c.get("path") for c in start["checkpoints"] if c.get("path")]
    return paths[-1] if paths else None


def _named(start: dict[str, Any], name: str) -> list[dict[str, Any]]:
    return [e for e in start["events"] if e["name"] == name]


# -------------------------------------------------------------------------------------------------
# findings


def judge(first: dict[str, Any], resume: dict[str, Any] | None, sim: dict[str, Any] | None,
          writes: list[dict[str, str]], *, origin: str) -> list[Finding]:
    findings = list(first["findings"])
    crash = next((f for f in findings if f.name == RUN_CRASHED.name), None)
    if crash is not None and refused_write(first) is crash:
        # the preflight's own refusal to overwrite a user's file stopped the script: not the script's
        # fault, and not checked either (the summary lists it under what was not exercised)
        findings.remove(crash)
        crash = None
    if crash is not None:
        specific = _where_it_crashed(first, crash)
        if specific is not None:
            findings.insert(0, specific)
    if resume is not None and resume["state"] != "completed":
        findings.append(resume_failed(resume, last_checkpoint(first) or "?"))
    findings += schedule_findings(sim or {})
    have = {f.name for f in findings}
    findings += [f for f in health_findings(first["dir"]) if f.name not in have]
    total = first["plan"].get("total_steps")
    seen = {e["data"]["name"]: e["data"]["every"] for e in _named(first, "due-seen")}
    for name, every in seen.items():
        if total and every and every > total:
            findings.append(path_never_runs(name, every, total))
    findings += _dominating(first, seen, total)
    lasting = [w for w in writes if not is_temporary(w["path"], origin)]
    if lasting:  # temp and cache files are listed in preflight.json, not flagged
        findings.append(wrote_outside(lasting, first))
    return findings


def health_findings(start_dir: Path) -> list[Finding]:
    """The health rules (trainguard.rules), run over what the preflight's first start recorded.

    The same rules as a live run's: a NaN at step 2, parameters missing from the optimizer or an LR at
    zero from the start show in a preflight's few steps as they would in the real run.
    """
    try:
        from trainguard.rules.engine import run_rules
    except ImportError:  # the rules engine is not part of this installation yet
        return []
    with RunReader(start_dir) as reader:
        if not reader.has_db or not hasattr(reader, "iter_events"):
            return []
        plan = reader.meta().get("plan") or {}
        events = list(reader.iter_events())
    return list(run_rules(events, plan, source="preflight"))


def _where_it_crashed(first: dict[str, Any], crash: Finding) -> Finding | None:
    """The brought-forward path (or the epoch boundary) that was running when the script crashed."""
    crash_id = first["crash_event_id"] or 10**12
    begun = [e for e in _named(first, "reiterate-begin") if e["id"] < crash_id]
    ok = [e for e in _named(first, "reiterate-ok") if e["id"] < crash_id]
    if begun and not ok:
        return second_epoch_failed(first, crash)
    forced = [e for e in _named(first, "forced") if e["id"] < crash_id]
    closed = {e["data"]["name"] for e in _named(first, "path-time") if e["id"] < crash_id}
    if forced and forced[-1]["data"]["name"] not in closed:
        return path_crashed(forced[-1]["data"], crash)
    return None


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


def _dominating(first: dict[str, Any], seen: dict[str, int], total: int | None) -> list[Finding]:
    step = _median_step(first)
    if not total or not step:
        return []
    out = []
    for e in _named(first, "path-time"):
        name, secs = e["data"]["name"], e["data"]["seconds"]
        every = seen.get(name)
        if not every or every <= 0 or every > total:
            continue
        path_total, train_total = (total // every) * secs, total * step
        if path_total > DOMINATES * train_total:
            out.append(path_dominates(name, every, secs, path_total, train_total))
    return out


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


# -------------------------------------------------------------------------------------------------
# estimates and the printed report


PREFLIGHT_TIMED_OUT = Code("TG609", "preflight-timed-out", "error", needs=(PREFLIGHT,),
                           page=timed_out, status="preview")


def _median_step(start: dict[str, Any]) -> float | None:
    """The median time of the plain training steps the preflight ran.

    Left out: the first step (one-time costs), the step that simulated the schedule, and each step whose
    interval holds a brought-forward path, a path that came due by itself (an eval every 5 steps runs at
    step 5 of a preflight too) or the loader's restart, so that only training is timed.
    """
    skip = {1} | {s + 1 for s in start.get("other_phase_steps", ())}
    for e in start["events"]:
        if e["name"] == "schedule":  # simulated in the optimizer pre-hook: before or after guard.step
            skip.update((e["step"], e["step"] + 1))
        elif e["name"] in ("forced", "epoch-cut", "epoch-end"):
            skip.add(e["step"] + 1)
    times = [t for step, t in start["step_times"] if step not in skip] or [t for _, t in start["step_times"]]
    return statistics.median(times) if times else None


def summarize(first: dict[str, Any], resume: dict[str, Any] | None, sim: dict[str, Any] | None,
              ckpt: str | None, writes: list[dict[str, str]], *, peak_rss: int | None) -> dict[str, Any]:
    plan = first["plan"]
    total, accum = plan.get("total_steps"), plan.get("grad_accum") or 1
    step = _median_step(first)
    cut = next((e["data"] for e in first["events"] if e["name"] in ("epoch-cut", "epoch-end")), None)
    per_epoch = (cut["len"] + accum - 1) // accum if cut and cut.get("len") else None
    seen = {e["data"]["name"]: e["data"]["every"] for e in _named(first, "due-seen")}
    paths = {e["data"]["name"]: round(e["data"]["seconds"], 4) for e in _named(first, "path-time")}
    forced = {e["data"]["name"]: e["data"]["step"] for e in _named(first, "forced")}
    extra = sum((total // seen[n]) * s for n, s in paths.items() if total and seen.get(n, 0) > 0)
    stop: dict[str, Any] = next((e["data"] for e in _named(first, "stop")), {})
    return {
        "steps_run": max([s["data"].get("step") or 0 for s in _named(first, "stop")] + [len(first["step_times"])]),
        "total_steps": total, "grad_accum": accum,
        "seconds_per_step": step, "steps_per_epoch": per_epoch,
        "seconds_per_epoch": step * per_epoch if step and per_epoch else None,
        "seconds_total_estimate": (step * total + extra) if step and total else None,
        "paths_seen": seen, "paths_forced": forced, "path_seconds": paths,
        "epoch_boundary": ("crossed" if _named(first, "reiterate-ok") else
                           "not crossed" if cut else "not exercised (the loop does not use guard.batches)"),
        "checkpoint": ckpt,
        "resume": ("not tested (no checkpoint reported with guard.checkpoint_saved)" if not ckpt else
                   "not run (the first start failed)" if resume is None else
                   "ok" if resume["state"] == "completed" and _named(resume, "resume-read") else
                   "ran, but the script never read guard.resume_from" if resume["state"] == "completed" else
                   f"failed ({resume['state']})"),
        "schedule": {k: v for k, v in (sim or {}).items() if k != "curve"} or None,
        "peak_rss_bytes": peak_rss, "cuda_peak_bytes": stop.get("cuda_peak_bytes"),
        "outside_writes": writes[:100], "probe_used": bool(first["events"]),
        "probe": first.get("probe"), "opt_steps": first.get("opt_steps", 0),
        "ranks": first.get("ranks") or {},
        **_coverage(first, sim),
    }


def refused_write(start: dict[str, Any]) -> Finding | None:
    """The crash of a start that the preflight's write watch caused by refusing a write, if it is one."""
    crash = next((f for f in start["findings"] if f.name == RUN_CRASHED.name), None)
    return crash if crash is not None and crash.evidence.get("exception") == "PreflightRefused" else None


def schedule_unchecked(sim: dict[str, Any] | None) -> str | None:
    """Why the LR schedule of a watched script went unchecked, or None when it was checked or there is none.

    A constant LR with no scheduler has no schedule to check; an LR that moved (a scheduler that could not
    be simulated, an LR set by hand that no function of the script reproduces) was not checked, and the
    preflight must not pass on it.
    """
    if not sim or not sim.get("skipped"):
        return None
    if sim.get("scheduler") is None and sim.get("set_by_hand") is False:
        return None
    return str(sim["skipped"])


def _coverage(first: dict[str, Any], sim: dict[str, Any] | None) -> dict[str, Any]:
    """What the preflight exercised and what it could not, said plainly for a script it cannot drive."""
    refused = refused_write(first)
    stopped = [] if refused is None else [
        f"the rest of the run from step {refused.step}: the script tried to change a file that existed "
        f"before, outside the scratch folder, the preflight refused it and the script stopped there "
        f"({refused.evidence.get('message')})"]
    if first.get("probe") == "watch":
        if stopped:
            return {"fast_forward": False, "checked": ["the steps and paths before the refused write"],
                    "not_checked": stopped}
        unsimulated = schedule_unchecked(sim)
        return {"fast_forward": True} if unsimulated is None else {
            "fast_forward": True, "schedule_checked": False, "not_checked": [f"the LR schedule ({unsimulated})"]}
    n = first.get("opt_steps", 0)
    checked = []
    if n:
        checked.append(f"{n} optimizer steps through the automatic probe (LR of each group, gradient norm, "
                       "update ratio, non-finite gradients) and the health rules on them")
    sched = sim or {}
    if sched.get("peak_lr") is not None:
        checked.append("the LR schedule, stepped as observed and simulated over "
                       + (sched.get("total_steps_from") or "the planned steps"))
    not_checked = ["evaluation, checkpoint saving and every other path the loop runs every N steps (brought "
                   "forward only through guard.due)",
                   "the epoch boundary (the loader iterated a second time, only through guard.batches)",
                   "resuming from a checkpoint (only with guard.checkpoint_saved and guard.resume_from)"]
    if sched.get("peak_lr") is None:
        why = sched.get("skipped") or ("no LR scheduler found" if n else "no optimizer step was made")
        not_checked.append(f"the LR schedule over the whole run ({why})")
    if not n:
        not_checked.insert(0, "any optimizer step: the script made none before it ended or was stopped")
    return {"fast_forward": False, "checked": checked, "not_checked": stopped + not_checked}


def report_lines(state: str, findings: list[Finding], s: dict[str, Any], run_dir: Path) -> list[str]:
    lines = [f"trainguard preflight: {state} in {s['seconds']:.1f} s"]
    if not s.get("fast_forward", True):
        if s.get("probe") is None:
            # no probe ever started: the script ended before its guard or its first optimizer step; whether it
            # calls trainguard.watch() is unknown (a script that crashes on line 4 never got there)
            lines.append("  the script never reached trainguard.watch() or an optimizer step before it ended or was "
                         "stopped: nothing could be fast-forwarded (the findings below say why it ended)")
        elif s.get("probe") != "watch":
            lines.append("  the script does not call trainguard.watch(): it cannot be fast-forwarded; the preflight "
                         "ran a few optimizer steps through the automatic probe and stopped it")
        lines.extend(f"  checked: {c}" for c in s.get("checked") or ["nothing"])
        lines.extend(f"  NOT checked: {c}" for c in s.get("not_checked") or [])
    elif not s["paths_forced"]:
        lines.append("  nothing brought forward: the loop never asked guard.due(...) (paths gated on `step % N`"
                     " are invisible to preflight)")
    if s["paths_forced"]:
        lines.append("  brought forward: " + ", ".join(
            f"{n} (every {s['paths_seen'].get(n)}, ran at step {st}"
            + (f", {s['path_seconds'][n]:.2f} s)" if n in s["path_seconds"] else ")")
            for n, st in s["paths_forced"].items()))
    lines.append(f"  epoch boundary: {s['epoch_boundary']}; checkpoint round trip: {s['resume']}")
    ranks = s.get("ranks") or {}
    if len(ranks) > 1:
        lines.append(f"  ranks: {len(ranks)} fast-forwarded in lockstep; " + ", ".join(
            f"rank {r} stopped at step {v['stopped_at']}" if v.get("stopped_at") is not None else f"rank {r} did not stop"
            for r, v in sorted(ranks.items(), key=lambda kv: int(kv[0]))))
    sched = s.get("schedule") or {}
    if sched.get("peak_lr") is not None and sched.get("function"):
        lines.append(f"  LR set by hand from {sched['function']}() (it reproduced the first steps' LRs; simulated by"
                     f" calling it): peak {sched['peak_lr']:.3g} at step {sched.get('peak_at')}, final"
                     f" {sched['final_lr']:.3g} at step {sched.get('total_steps')} (curve: schedule.json)")
    elif sched.get("peak_lr") is not None:
        r = sched.get("ratio") or 0
        lines.append(f"  LR schedule ({sched.get('scheduler')}, {r:g} scheduler step{'' if r == 1 else 's'} per optimizer"
                     f" step): peak {sched['peak_lr']:.3g} at step {sched.get('peak_at')}, final {sched['final_lr']:.3g}"
                     f" at step {sched.get('total_steps')} (curve: schedule.json)")
    elif sched.get("skipped") or sched.get("truncated"):
        lines.append(f"  LR schedule: {sched.get('skipped') or sched.get('truncated')}")
    elif s["probe_used"]:
        lines.append("  LR schedule: not checked (the script stopped before the schedule could be measured)")
    est = [f"{fmt_duration(s['seconds_per_step'])}/step" if s["seconds_per_step"] else None,
           f"{fmt_duration(s['seconds_per_epoch'])}/epoch" if s["seconds_per_epoch"] else None,
           f"{fmt_duration(s['seconds_total_estimate'])} for {s['total_steps']} steps"
           if s["seconds_total_estimate"] else None,
           f"peak memory {s['peak_rss_bytes'] / 2**20:.0f} MiB (host)" if s["peak_rss_bytes"] else None,
           f"{s['cuda_peak_bytes'] / 2**20:.0f} MiB (GPU)" if s.get("cuda_peak_bytes") else None]
    if any(est):
        lines.append("  estimates: " + ", ".join(e for e in est if e))
    if not findings:
        lines.append("  no findings")
    for f in findings:
        lines.append(f"  {f.one_line()}")
        if f.where:
            lines.append(f"    where: {f.where}")
        if f.fix:
            lines.append(f"    fix: {f.fix}")
    lines.append(f"  run folder {run_dir} ({time.strftime('%H:%M:%S')})")
    return lines
