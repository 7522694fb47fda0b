"""How a run ended, judged where both the watchdog and a probe running alone need it.

The watchdog's verdict (watchdog/verdict.py) and the probe's own ending (a script run without
`trainguard run`) both say when a script exited without finishing its guard; they build the finding here.
"""

from __future__ import annotations

import signal
from typing import Any

from trainguard.findings import PROBE, PROCESS, Code, Finding


def early_end(step: int | None, *, total_steps: int | None, exited_normally: bool) -> str | None:
    """Why an unfinished guard says the run stopped early, or None when nothing says so.

    The evidence the probe can see: the interpreter never reached its normal exit (`os._exit`, a process
    that died without a word), a declared `total_steps` it fell short of, or no training step at all.
    """
    if not exited_normally:
        return "the interpreter never reached its normal exit (os._exit(), or a process ended from outside)"
    if not step:
        return "it made no training step"
    if total_steps is not None and step < total_steps:
        return f"it stopped at step {step} of the {total_steps} declared (total_steps)"
    return None


def probe_not_finished(step: int | None, *, total_steps: int | None = None, exited_normally: bool = True
                       ) -> Finding:
    """TG506 probe-not-finished: the script exited without reaching `guard.finish()`.

    What it detects: a process that exited (often with code 0) while its probe was never finished. An error
    when the evidence says the run ended early: an `os._exit(0)` (the interpreter never reached its normal
    exit), a `sys.exit(0)` from a branch that skips the rest before the declared `total_steps`, no training
    step at all. A warning when the script simply ended through the interpreter's normal exit with no such
    sign (a short script that never calls `guard.finish()`): then the run is `completed` and the exit code
    is the command's.
    Why it matters: exit 0 is not proof that the work was done; seed 000's monitor reported "Training
    complete" while the script had done nothing for 13 minutes.
    Example: exit code 0 at step 1200 of the 5000 declared; the probe never reached finish().
    What to change: call `guard.finish()` at the true end of the script, or use `with trainguard.watch(...)`.
    """
    at = f" at step {step}" if step is not None else ""
    why = early_end(step, total_steps=total_steps, exited_normally=exited_normally)
    if why is None:
        return Finding.of(
            PROBE_NOT_FINISHED, step=step, severity="warning",
            summary=f"the script exited{at} without calling guard.finish(), through the interpreter's normal exit"
                    " and with no sign that it stopped early: taken as completed",
            evidence={"step": step, "total_steps": total_steps, "exited_normally": True},
            fix="Call guard.finish() at the end of the script (or use `with trainguard.watch(...) as guard:`)"
                " so its end is confirmed rather than assumed.",
            source="watchdog",
        )
    return Finding.of(
        PROBE_NOT_FINISHED, step=step,
        summary=f"the script exited{at} without reaching guard.finish(), and {why}: its end was never confirmed",
        evidence={"step": step, "total_steps": total_steps, "exited_normally": exited_normally, "early": why},
        fix="Call guard.finish() at the true end of the script (or use `with trainguard.watch(...) as guard:`);"
            " if the script left early on purpose, let it say so by finishing the guard first.",
        source="watchdog",
    )


PROBE_NOT_FINISHED = Code("TG506", "probe-not-finished", "error", needs=(PROBE,), page=probe_not_finished)


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def killed_finding(signum: int, *, step: int | None, oom: dict[str, Any]) -> Finding:
    """TG503 run-killed: the process was ended by a signal that trainguard did not send.

    What it detects: death by signal (SIGKILL, SIGTERM, SIGSEGV, ...), with what likely sent it. A SIGKILL
    that nobody in trainguard asked for is usually the kernel's OOM killer; the kernel log and the
    cgroup's oom_kill counter are read where they are readable. The cause the output printed (the
    catalogue in rules/signatures.py: `CUDA error: out of memory` before an abort) is added to it. In a
    log (`trainguard diagnose`): the kernel's OOM killer, a shell's `Killed`, a scheduler's cut-off
    (SLURM's `CANCELLED ... DUE TO TIME LIMIT`, LSF's `TERM_RUNLIMIT`), quoted with its line number.
    Why it matters: a killed process leaves no traceback; without this the run simply "went quiet".
    Example: SIGKILL at step 812; cgroup memory.events oom_kill went 0 → 1.
    What to change: for the OOM killer, reduce host memory (DataLoader workers × prefetch, caching, a
    memory leak: see memory-creep); otherwise find who sent the signal (scheduler preemption, a timeout).
    """
    name = signal_name(signum)
    cause = None
    likely = ""
    if signum == signal.SIGKILL:
        if oom.get("oom_kills_delta") or oom.get("kernel_lines"):
            cause = "oom-killer"
            likely = "the kernel's OOM killer (confirmed by the kernel)"
        else:
            cause = "oom-killer?"
            likely = ("most often the kernel's OOM killer when nobody in trainguard asked for it (the kernel log and"
                      " cgroup counters could not confirm it)")
    elif signum == signal.SIGTERM:
        cause, likely = "terminated", "a SIGTERM: a job scheduler's preemption or time limit, or a person"
    elif signum == signal.SIGSEGV:
        cause, likely = "segfault", "a segmentation fault in native code (a CUDA/C++ extension, a driver)"
    elif signum == signal.SIGINT:
        cause, likely = "interrupted", "an interrupt (Ctrl-C)"
    else:
        cause, likely = name.lower(), f"{name}"
    at = f" at step {step}" if step is not None else ""
    fix = {
        "oom-killer": "Reduce host memory: fewer DataLoader workers or prefetch, no caching of the dataset in RAM,"
                      " look for a leak (host memory growing step by step); give the job more memory.",
        "oom-killer?": "Check `dmesg` (as root) for 'Killed process'; if it was the OOM killer, reduce host memory"
                       " (DataLoader workers × prefetch, dataset caching, leaks).",
        "segfault": "Run with `PYTHONFAULTHANDLER=1` to get the Python frames; update or pin the native extension.",
    }.get(cause or "", "Find who sent the signal; resume from the last checkpoint.")
    return Finding.of(
        RUN_KILLED, step=step,
        summary=f"the process was killed by {name}{at}: {likely}",
        evidence={"signal": name, **{k: v for k, v in oom.items() if v not in (None, [], 0)}},
        fix=fix, cause=cause, source="watchdog",
    )


RUN_KILLED = Code("TG503", "run-killed", "error", needs=(PROCESS,), page=killed_finding)
