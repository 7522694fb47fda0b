"""Crashes: the exception, where it happened in the user's code, and what that usually means.

Two sources feed the same finding: the probe's own record (it saw the exception with the step and the
phase) and, for scripts without the probe, the traceback parsed from the captured stderr.
"""

from __future__ import annotations

import re
import sysconfig
from dataclasses import dataclass
from typing import Any

from trainguard.findings import PROCESS, Code, Finding
from trainguard.rules.signatures import classify

_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<function>.+?)\s*$')
_EXC_LINE = re.compile(r"^(?P<type>[A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit|Warning|Fault|[A-Z]\w*))(?::\s?(?P<msg>.*))?$")


@dataclass
class ParsedTraceback:
    exception: str
    message: str
    frames: list[dict[str, Any]]


def parse_traceback(lines: list[str]) -> ParsedTraceback | None:
    """The last Python traceback in `lines` (stderr), or None when there is none."""
    start = None
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith("Traceback (most recent call last):"):
            start = i
            break
    if start is None:
        return None
    frames: list[dict[str, Any]] = []
    exc_type, message = None, ""
    i = start + 1
    while i < len(lines):
        line = lines[i].rstrip("\n")
        m = _FRAME.match(line)
        if m:
            code = None
            if i + 1 < len(lines) and not _FRAME.match(lines[i + 1]) and lines[i + 1].startswith("    "):
                code = lines[i + 1].strip()
                i += 1
            frames.append({"file": m["file"], "line": int(m["line"]), "function": m["function"], "code": code})
        elif line and not line.startswith(" ") and frames:
            em = _EXC_LINE.match(line)
            if em:
                exc_type = em["type"].rsplit(".", 1)[-1]
                message = (em["msg"] or "").strip()
                # a message may continue on following unindented lines until a blank or a new traceback
                break
        i += 1
    if exc_type is None:
        return None
    return ParsedTraceback(exception=exc_type, message=message, frames=frames)


_LIB_DIRS = tuple(
    p for p in {sysconfig.get_paths().get("stdlib"), sysconfig.get_paths().get("purelib"),
                sysconfig.get_paths().get("platlib")} if p
)


_STEP_PRINTED = re.compile(r"\b(?:step|iter(?:ation)?)\b[\s=:#]*(\d+)", re.I)


def last_printed_step(lines: Any) -> int | None:
    """The step a script without the probe last printed ("step 1999 loss=..."), or None."""
    for line in reversed(list(lines)):
        m = _STEP_PRINTED.search(line)
        if m:
            return int(m.group(1))
    return None


def is_user_frame(filename: str) -> bool:
    """A frame of the user's code: not the standard library, not an installed package, not trainguard."""
    if filename.startswith("<"):
        return False
    if "site-packages" in filename or "dist-packages" in filename:
        return False
    if "/trainguard/" in filename and "/scenarios/" not in filename:
        return False
    return not any(filename.startswith(d) for d in _LIB_DIRS)


def innermost_user_frame(frames: list[dict[str, Any]]) -> dict[str, Any] | None:
    for frame in reversed(frames):
        if is_user_frame(frame["file"]):
            return frame
    return frames[-1] if frames else None


def format_where(frame: dict[str, Any] | None) -> str | None:
    if not frame:
        return None
    return f"{frame['file']}:{frame['line']} ({frame['function']})"


# A failure that another process's failure explains: its peer went away, its collective timed out or was
# aborted, or the launcher stopped it. One definition for the probe's crash events and for the output's
# tracebacks (rules/firstfailure.py).
CONSEQUENCE = re.compile(
    r"Connection closed by peer|Connection reset by peer|Broken pipe|remote worker crash"
    r"|Watchdog caught collective operation timeout|[Cc]ommunicator was aborted|NCCL.*abort"
    r"|[Gg]loo.*[Tt]imed? ?out|Timed out waiting|Socket Timeout|DistBackendError|DistNetworkError|DistStoreError"
    r"|SignalException|[Gg]ot signal: ?\d+|KeyboardInterrupt")


# A process's own device fault: it failed first even where its message also says its collective broke
# (NCCL's process-group watchdog finds the fault in its next collective and aborts with DistBackendError).
# "device-side assert triggered", not "device-side assert": every CUDA error torch raises ends with "Compile
# with `TORCH_USE_CUDA_DSA` to enable device-side assertions", an out-of-memory or a missing kernel image too.
DEVICE_FAULT = re.compile(r"device-side assert triggered|cudaErrorAssert|an illegal memory access|misaligned address"
                          r"|unspecified launch failure")


def is_consequence(text: str) -> bool:
    """`Type: message` of a failure that another process's failure explains (CONSEQUENCE), unless it is
    this process's own device fault."""
    return bool(CONSEQUENCE.search(text)) and not DEVICE_FAULT.search(text)


def classify_crash(exception: str, message: str) -> tuple[str | None, str]:
    """(cause, fix) of an exception, from the one catalogue of failure signatures (rules/signatures.py):
    first match wins, the specific (a device-side assert, a timeout) before the general."""
    sig = classify(f"{exception}: {message}")
    if sig is not None:
        return sig.cause, sig.fix
    return None, "Read the exception and the frame named in `where`; fix the code there and rerun."


def crash_finding(
    *,
    exception: str,
    message: str,
    frames: list[dict[str, Any]],
    step: int | None,
    phase: str | None = None,
    elapsed: float | None = None,
    phases_seen: dict[str, int] | None = None,
    exit_code: int | None = None,
    source: str = "watchdog",
) -> Finding:
    """TG501 run-crashed: the run ended with an uncaught exception.

    What it detects: a non-zero exit with a Python exception, from the probe's own record or from the
    traceback in stderr; or a failure the output printed without a traceback (a CUDA error from C++, a
    segfault, `terminate called ...`, a C assertion, a launch that failed: the catalogue in
    rules/signatures.py), quoted with its line number (rules/sightings.py).
    Why it matters: a crash late in a run (the first evaluation after 2,000 steps, seed 001; the final
    evaluation after 12,500, seed 004) costs every step before it.
    Example: `TypeError: unsupported operand type(s) for %: 'NoneType' and 'int'` at
    models/distillation_framework.py:809 in phase "eval", first evaluation, at step 1999.
    What to change: the fix names the signature's usual cause; `trainguard preflight` reaches rare
    paths (eval, checkpoint) in the first minute.
    """
    frame = innermost_user_frame(frames)
    where = format_where(frame)
    cause, fix = classify_crash(exception, message)
    context = []
    if phase:
        nth = (phases_seen or {}).get(phase)
        first = (" (the first time this phase ran in this run)" if nth == 1
                 else (f" (run {nth} of this phase; earlier runs passed)" if nth else ""))
        context.append(f"in phase '{phase}'{first}")
    if step is not None:
        context.append(f"at step {step}")
    if elapsed is not None:
        context.append(f"after {_duration(elapsed)}")
    summary = f"{exception}: {message}"[:300]
    if context:
        summary += " — " + ", ".join(context)
    evidence: dict[str, Any] = {
        "exception": exception,
        "message": message[:2000],
        "frames": [f"{f['file']}:{f['line']} in {f['function']}" + (f": {f['code']}" if f.get("code") else "")
                   for f in frames[-8:]],
    }
    if phase:
        evidence["phase"] = phase
        evidence["phase_first_time"] = (phases_seen or {}).get(phase) == 1
    if elapsed is not None:
        evidence["elapsed_seconds"] = round(elapsed, 1)
    if exit_code is not None:
        evidence["exit_code"] = exit_code
    return Finding.of(
        RUN_CRASHED, step=step, summary=summary, evidence=evidence,
        fix=fix, cause=cause, where=where, exception=exception, source=source,
    )


RUN_CRASHED = Code("TG501", "run-crashed", "error", needs=(PROCESS,), page=crash_finding)


_ABORT = re.compile(r"terminate called after throwing an instance of '([^']+)'")
_WHAT = re.compile(r"^\s*(?:\[rank\d+\]:\s*)?what\(\):\s*(.*)")
# std::terminate with no exception: a C++ thread object destroyed while its thread still runs, which at a
# process's exit is a runtime's teardown racing its own worker threads. PyTorch 2.13's gloo does it now and
# then when a DDP model outlives its process group into the interpreter's teardown (about 1 run in 10 of
# a 2-rank CPU job on a loaded machine: 15 in 116; none in 60 with the model freed before `destroy_process_group()`).
TEARDOWN_ABORT = "std::terminate: called without an active exception"
_TEARDOWN = re.compile(r"terminate called without an active exception")
TEARDOWN_EXPLAINED = ("aborted as its process ended: std::terminate without an exception, a C++ thread still "
                      "running at teardown (under gloo, PyTorch's process-group teardown: pytorch/pytorch#190489)")
TEARDOWN_FIX = ("The training itself may have finished: check its last step and that its outputs (checkpoint, "
                "metrics) were written before the abort. Free the model and optimizer before "
                "`dist.destroy_process_group()` (`del model, optimizer; gc.collect()`), so no tensor of the "
                "process group's work is left for the interpreter's teardown.")


def native_abort(lines: list[str]) -> str | None:
    """"gloo::EnforceNotMet: ... Received data size doesn't match expected size ..." from the C++ runtime's
    last words before abort() (`terminate called after throwing ...` and its `what():` line), if the
    output has them: a process that aborts this way records no Python error."""
    for i, line in enumerate(lines):
        m = _ABORT.search(line)
        if m is None:
            if _TEARDOWN.search(line):
                return TEARDOWN_ABORT
            continue
        what = next((w.group(1) for w in map(_WHAT.match, lines[i + 1:i + 3]) if w), "")
        # gloo prefixes "[enforce fail at <path>:<line>] <check>." before the sentence that explains it
        what = re.sub(r"^\[enforce fail at [^\]]*\]\s*", "", what)
        return f"{m.group(1)}: {what}" if what else m.group(1)
    return None


def _clip(text: str, n: int) -> str:
    """At most n characters, cut at a word, with an ellipsis when cut (never "caused by a remo")."""
    if len(text) <= n:
        return text
    return text[:n].rsplit(" ", 1)[0].rstrip(",;:") + "…"


def first_crash(crashes: list[dict[str, Any]], silent_ranks: list[int] | None = None,
                abort: str | None = None) -> Finding | None:
    """TG501 for a run whose processes recorded crashes (`crash` events): the first to fail is the cause.

    In a multi-process run one failure brings down the rest: rank 1 raises a ValueError, and rank 0 then
    dies of "Connection closed by peer" in its next collective, later, so the last crash is the least
    telling one. The earliest is the finding; the later ones are listed in its evidence as consequences,
    each saying why it is one (a connection lost to a rank that had failed, a collective that timed out).

    `silent_ranks`: ranks that recorded neither a crash nor a finish (killed, a segfault, `os._exit`).
    When every recorded crash only says that a peer went away, such a rank is where to look: it is named,
    with `abort` (`native_abort` of the output) when the C++ runtime said why it aborted.
    """
    if not crashes:
        return None
    ordered = sorted(crashes, key=lambda c: (c["t"], c.get("rank") or 0))
    first, later = ordered[0], ordered[1:]
    d = first.get("data") or {}
    finding = crash_finding(
        exception=d.get("exception", first.get("name") or "Exception"), message=d.get("message", ""),
        frames=d.get("frames", []), step=first.get("step"), phase=d.get("phase"), elapsed=d.get("elapsed"),
        phases_seen=d.get("phases_seen"),
    )
    ranks = {c.get("rank") for c in ordered}
    silent = sorted(r for r in (silent_ranks or []) if r not in ranks)
    if len(ranks) > 1 or later or silent:
        finding.evidence["rank"] = first.get("rank")
        finding.evidence["pid"] = first.get("pid")
        finding.evidence["consequences"] = [_consequence(c, first) for c in later]
        finding.summary = (f"rank {first.get('rank')} failed first: {finding.summary}"
                           + (f" ({len(later)} later failure(s) on other processes are consequences)" if later else ""))
    if silent and all(_lost_peer(c) for c in ordered):
        # Every error recorded is a lost peer: the cause is a rank that ended without a Python error.
        who = ", ".join(f"rank {r}" for r in silent)
        finding.evidence["silent_ranks"] = silent
        if len(silent) == 1:  # the origin is the silent rank; the first recorded error only lost it
            finding.evidence["first_error_rank"] = finding.evidence.get("rank")
            finding.evidence["rank"] = silent[0]
        lost = (f"the others lost their connection to it: rank {first.get('rank')}'s error is a consequence "
                f"({d.get('exception', first.get('name'))}: {_clip(_first_line(d.get('message')), 160)})")
        if abort:
            finding.evidence["native_abort"] = abort
            finding.summary = f"{who} aborted in native code ({_clip(abort, 240)}) and {lost}"
        else:
            finding.summary = f"{who} ended without a Python error (killed by a signal, a segfault, os._exit) and {lost}"
        cause, fix = classify_crash(*abort.split(": ", 1)) if abort and ": " in abort else (None, "")
        if cause == "cuda-device-assert":
            finding.fix, finding.cause = fix, cause  # its own device fault, which NCCL's watchdog turned into an abort
            return finding
        if abort and "collective mismatch" in abort:
            finding.fix = ("the ranks called different collectives (gloo received a message of another size than "
                           "it expected): make every rank call the same collectives in the same order, with "
                           "tensors of the same shape; look for a collective inside a rank-dependent branch")
        else:
            finding.fix = (f"look at how {who} ended: its exit code in torchrun's summary (-9: the OOM killer or a "
                           "kill; -11: a segfault in native code; -6: an abort), dmesg, its last lines of output")
        finding.cause = "rank-vanished"
    return finding


def _lost_peer(crash: dict[str, Any]) -> bool:
    d = crash.get("data") or {}
    exception, message = str(d.get("exception", crash.get("name"))), str(d.get("message") or "")
    # gloo's "Read error ...: Connection reset by peer" is a lost peer too, though no collective timed out
    text = f"{exception}: {message}"
    return not DEVICE_FAULT.search(text) and (classify_crash(exception, message)[0] in ("collective-timeout", "nccl-error")
                                              or bool(CONSEQUENCE.search(message)))


def _consequence(crash: dict[str, Any], first: dict[str, Any]) -> str:
    d = crash.get("data") or {}
    t_first = first.get("t") or 0.0
    why = (f"a consequence: it lost rank {first.get('rank')}, which had failed" if _lost_peer(crash)
           else "after the first failure, so most likely a consequence")
    return (f"rank {crash.get('rank')} (pid {crash.get('pid')}), {(crash.get('t') or t_first) - t_first:+.1f} s "
            f"later: {d.get('exception', crash.get('name'))}: {_clip(_first_line(d.get('message')), 200)} — {why}")


def _first_line(text: Any) -> str:
    lines = str(text or "").splitlines()
    return lines[0] if lines else ""


def _duration(seconds: float) -> str:
    if seconds < 1:
        return "<1 s"  # never "after 0 s"
    seconds = int(seconds)
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds / 3600:.1f} h"


def _divergence_signs() -> set[str]:
    """The findings that say the loss diverged or went non-finite (TG208, TG206, TG301, TG302), by their
    declarations (imported here: those rules' modules come after this one)."""
    from trainguard.rules.divergence import LossDiverged, LossDiverging
    from trainguard.rules.numerics import NonfiniteGrad, NonfiniteLoss

    return {r.name for r in (LossDiverged, LossDiverging, NonfiniteLoss, NonfiniteGrad)}


def after_divergence(crashed: Finding, earlier: list[Finding], lr: Any = None) -> Finding:
    """A crash that came after the run's loss diverged (TG208, TG206) or went non-finite: the crash's summary
    says so and its fix starts with the LR, the likely cause; the crash's own fix follows. A crash with no
    such sign before it is returned unchanged."""
    step = crashed.step
    signs = [f for f in earlier if f.name in _divergence_signs() and f.step is not None
             and (step is None or f.step <= step)]
    if not signs or crashed.evidence.get("after_divergence"):
        return crashed
    sign = min(signs, key=lambda f: f.step or 0)
    at_lr = sign.evidence.get("lr")
    at_lr = at_lr if isinstance(at_lr, (int, float)) and not isinstance(at_lr, bool) else lr
    lr_words = f" at lr {at_lr:.3g}" if isinstance(at_lr, (int, float)) and not isinstance(at_lr, bool) else ""
    crashed.summary += f"; it came after {sign.name} ({sign.code}) from step {sign.step}{lr_words}"
    crashed.fix = (f"The loss was diverging before the crash ({sign.name} from step {sign.step}{lr_words}): lower "
                   "the LR (or lengthen its warm-up) and clip gradients, then rerun; the crash is its consequence. "
                   + crashed.fix)
    crashed.evidence["after_divergence"] = {"name": sign.name, "code": sign.code, "step": sign.step, "lr": at_lr}
    return crashed
