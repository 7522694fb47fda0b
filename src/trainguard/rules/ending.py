"""How a run ended, judged where both the watchdog and a probe running alone need it.

The watchdog's verdict (watchdog/verdict.py) and the probe's own ending (a script run without
`trainguard run`) both say when a script exited without finishing its guard; they build the finding here.
"""

from __future__ import annotations

from trainguard.findings import PROBE, Code, Finding


def probe_not_finished(step: int | None) -> Finding:
    """TG506 probe-not-finished: the script exited without reaching `guard.finish()`.

    What it detects: a process that exited (often with code 0) while its probe was never finished, e.g. an
    `os._exit(0)`, a `sys.exit(0)` from a branch that skips the rest, or a forgotten `guard.finish()`.
    Why it matters: exit 0 is not proof that the work was done; seed 000's monitor reported "Training
    complete" while the script had done nothing for 13 minutes.
    Example: exit code 0 at step 1200 of 5000; the probe never reached finish().
    What to change: call `guard.finish()` at the true end of the script, or use `with trainguard.watch(...)`.
    """
    at = f" at step {step}" if step is not None else ""
    return Finding.of(
        PROBE_NOT_FINISHED, step=step,
        summary=f"the script exited{at} without reaching guard.finish(): its end was never confirmed",
        evidence={"step": step},
        fix="Call guard.finish() at the true end of the script (or use `with trainguard.watch(...) as guard:`);"
            " if the script left early on purpose, let it say so by finishing the guard first.",
        source="watchdog",
    )


PROBE_NOT_FINISHED = Code("TG506", "probe-not-finished", "error", needs=(PROBE,), page=probe_not_finished)
