"""How a run ended, judged where both the watchdog and a probe running alone need it.

The watchdog's verdict (watchdog/verdict.py) and the probe's own ending (a script run without
`trainguard run`) both say when a script exited without finishing its guard; they build the finding here.
"""

from __future__ import annotations

from trainguard.findings import PROBE, Code, Finding


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
