"""What a preflight found: its findings, its estimates and the lines it prints.

The inputs are plain: each start's status.json and run store (what the watchdog and the probe wrote),
the simulated schedule and the list of files written outside the scratch folder. Every finding names
the path, the step the real run would have reached it at, and the preflight step it failed at; the
findings themselves are built by the preflight's rules (preflight/runrules.py).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

from trainguard.findings import Finding
from trainguard.preflight.runrules import (
    path_crashed,
    path_dominates,
    path_never_runs,
    resume_failed,
    second_epoch_failed,
    wrote_outside,
)
from trainguard.preflight.schedule import fmt_duration, schedule_findings
from trainguard.preflight.scratch import is_temporary
from trainguard.rules.crash import RUN_CRASHED, TEARDOWN_EXPLAINED
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


def _stopped_then_aborted(start: dict[str, Any]) -> bool:
    """Every rank made its steps and was stopped by the preflight, and the only error is the C++ runtime's
    abort at the process's teardown (gloo's process-group teardown racing its threads, rules/crash.py): the
    resume itself worked; what ended badly is the exit, which the real run's own end would show."""
    ranks = start.get("ranks") or {}
    errors = [f for f in start["findings"] if f.severity == "error"]
    return bool(ranks) and all(r.get("stopped_at") is not None for r in ranks.values()) and bool(errors) and \
        all(TEARDOWN_EXPLAINED in (f.summary or "") for f in errors)


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
    if resume is not None and resume["state"] != "completed" and not _stopped_then_aborted(resume):
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


# -------------------------------------------------------------------------------------------------
# estimates and the printed report


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
                   "ok, then the process aborted at its teardown (gloo's, after its steps)"
                   if _stopped_then_aborted(resume) else
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
