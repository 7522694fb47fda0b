"""What a log alone can show, beyond the metrics the rules read: its end, and PyTorch's own warnings.

A traceback becomes the watchdog's own `run-crashed` finding (`trainguard.rules.crash`), parsed the
same way as a live run's stderr; the two rules here exist only for logs.
"""

from __future__ import annotations

import time
from typing import Any

from trainguard.findings import OUTPUT, STEPS, Code, Finding

STILL_WRITING = 120.0  # seconds: a log written this recently may belong to a run still going


def log_ends_unfinished(path: str, last_line: str | None, lines: int, last_step: int | None, *,
                        ends_with: str | None = None, snapshot: str | None = None,
                        mtime: float | None = None, now: float | None = None, alive: bool = False,
                        cut_off: str | None = None) -> Finding:
    """TG531 log-ends-unfinished: a log that ends without any sign that the run completed.

    ## What it detects
    A training log that has no completion line ("Training complete", Hugging Face's closing
    `train_runtime` summary, Lightning's "`Trainer.fit` stopped", pytorch/examples' "End of training",
    `done: 1024 steps`), whose steps never reach the planned total (`max_steps`, the last of N epochs)
    and that has no traceback. The finding gives the last line and the last step seen. Its severity
    comes from the data alone, never from the file's age:
    - a warning when the log stops among its steps (after a step line, mid-epoch), or anywhere short of the
      plan the log itself states (`Epoch 17/200`, `step 320` of `--learning_steps 50000`): "cut off at
      epoch 17 of 200 (8%)" is never the verdict of a run that finished;
    - info when it stops right after an evaluation or an epoch's summary (a natural end whose plan
      the log does not state), or when the file is a checkpoint's snapshot (a Hugging Face
      `checkpoint-N/trainer_state.json` never holds the closing summary).

    ## Why it matters
    Silence is not success. A run killed by the OOM killer, a preempted node or a hang leaves exactly
    this: a log that stops. Seed 000's monitor reported "Training complete" for a process that had hung
    for 13 minutes; seed 003's YOLO run hung for 7.8 hours after its last line.

    ## Example
    `TG531 log-ends-unfinished [warning] at step 4886: train.log ends at step 4886 among its steps,
    without a completion line (its last line: "Epoch 2/100 ... 4886/41163")`

    ## What to change
    Find out how the process ended (`dmesg` for the OOM killer, the scheduler's logs); run it under
    `trainguard run`, which tells a hang, a kill and a crash apart as they happen.

    ## Known false positives
    A script that prints nothing at its end and stops after a step line; a log of a run that is still
    going: ask with `trainguard diagnose --alive`, which reads the file's modification time (written in
    the last two minutes: info, the run may still be going).

    ## Options
    `--alive`: also judge from the file's modification time whether the run may still be going.
    """
    at = f" at step {last_step}" if last_step is not None else ""
    quote = f': "{last_line[:120]}"' if last_line else ""
    severity = "warning"
    evidence: dict[str, Any] = {"last_line": last_line, "lines": lines, "last_step": last_step}
    if snapshot:
        severity, cause = "info", "snapshot"
        summary = (f"{path} is {snapshot}: a snapshot taken while the run went on has no completion entry, so "
                   "it cannot tell how the run ended")
        evidence["snapshot"] = snapshot
    elif cut_off:
        cause = "short-of-plan"
        last = f' (its last line: "{last_line[:120]}")' if last_line else ""
        summary = f"{path} is cut off at {cut_off}, without a completion line{last}"
        evidence["cut_off"] = cut_off
    elif ends_with in ("eval", "summary"):
        severity, cause = "info", "boundary"
        what = "an evaluation" if ends_with == "eval" else "an epoch's summary"
        planless = "" if last_line and " plans " in last_line else (" and without a plan that says how long the run "
                                                                   "was meant to be")
        summary = f"{path} ends{at} right after {what}, without a completion line{planless}{quote}"
    else:
        cause = "among-steps"
        last = f' (its last line: "{last_line[:120]}")' if last_line else ""
        summary = f"{path} ends{at} among its steps, without a completion line{last}"
    if alive:  # asked: is the run still going? Only then does the file's age count
        now = time.time() if now is None else now
        age = (now - mtime) if mtime is not None else None
        evidence["seconds_since_last_write"] = round(age, 1) if age is not None else None
        if age is not None:
            summary += f"; its last line was written {_ago(age)} ago"
            if age < STILL_WRITING:
                severity, cause = "info", "still-writing"
                summary += " (the run may still be going)"
    return Finding.of(
        LOG_ENDS_UNFINISHED, severity=severity, step=last_step, cause=cause,
        summary=summary, source="diagnose", evidence=evidence,
        fix="find out how the process ended (dmesg for the OOM killer, the scheduler's logs); run it under "
            "`trainguard run`, which tells a hang, a kill and a crash apart as they happen",
    )


LOG_ENDS_UNFINISHED = Code("TG531", "log-ends-unfinished", "warning", needs=(STEPS,),
                           page=log_ends_unfinished)


def launch_failed(path: str, message: str) -> Finding:
    """TG501 run-crashed, for a command line refused before training started (argparse exits 2)."""
    from trainguard.rules.crash import crash_finding

    f = crash_finding(exception="SystemExit", message=f"the command line was refused at launch: {message}",
                      frames=[], step=None, exit_code=2, source="diagnose")
    f.cause = "launch-refused"
    f.fix = "fix the argument the error names (see the usage text above it in the log) and launch again"
    return f


def scheduler_before_optimizer(path: str, lineno: int, count: int) -> Finding:
    """TG151 scheduler-before-optimizer: PyTorch warned that `lr_scheduler.step()` ran before `optimizer.step()`.

    ## What it detects
    PyTorch's own `UserWarning: Detected call of lr_scheduler.step() before optimizer.step()` in a log.

    ## Why it matters
    The first value of the schedule is skipped, and often worse: the warning also appears when the
    optimizer step never ran because the GradScaler skipped it (inf/NaN gradients at the start), or when
    the scheduler is stepped per micro-batch while the optimizer steps per accumulation window, the
    mismatch that sent seed 002's LR to zero after 6% of its run.

    ## Example
    `TG151 scheduler-before-optimizer [warning]: train.log line 212: PyTorch warned that
    lr_scheduler.step() was called before optimizer.step()`

    ## What to change
    Call `optimizer.step()` then `scheduler.step()`, both once per optimizer step (every `grad_accum`
    micro-batches); with AMP, expect the warning once if the first steps are skipped, and check that
    the loss scale settles.

    ## Known false positives
    AMP runs whose very first step is skipped by the GradScaler print it once, harmlessly.
    """
    return Finding.of(
        SCHEDULER_BEFORE_OPTIMIZER, step=None, source="diagnose",
        summary=f"{path} line {lineno}: PyTorch warned that lr_scheduler.step() was called before optimizer.step()"
                + (f" ({count} times)" if count > 1 else ""),
        evidence={"line": lineno, "count": count},
        fix="call optimizer.step() then scheduler.step(), both once per optimizer step (every grad_accum "
            "micro-batches)",
    )


SCHEDULER_BEFORE_OPTIMIZER = Code("TG151", "scheduler-before-optimizer", "warning", needs=(OUTPUT,),
                                  page=scheduler_before_optimizer)


def _ago(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 1:
        return "<1 s"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"
