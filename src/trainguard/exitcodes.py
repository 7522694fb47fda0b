"""Every exit code trainguard's commands give, in one table: the code reads the constants, the CLI help and
the docs (docs/exit-codes.md, via `python -m trainguard.exitcodes`) render the table.

Why these numbers: a shell pipeline (`trainguard run -- python train.py && publish`) must stop on anything
but a good run, so every bad end is non-zero; the command's own code passes through when it crashed (a
script's `sys.exit(3)` means what its author said); 122-125 sit below 126-128, which shells reserve, and
above the small codes scripts use; 124 is `timeout(1)`'s "timed out"; 128+N is a shell's "killed by N".
"""

from __future__ import annotations

from dataclasses import dataclass

OK = 0
FINDINGS = 1  # preflight, check, diagnose: error findings
BAD_INPUT = 2
PREFLIGHT_INCOMPLETE = 3
INTERNAL = 70  # sysexits' EX_SOFTWARE: trainguard itself failed
CUT_OFF = 121  # `run`: its job scheduler cut it (time limit, preemption, requeue, a node's failure), unsaved
HEALTH = 122  # `run`: completed, but findings at --fail-on's severity (default: error) that nobody acknowledged
FAILED = 123  # `run`: the command exited 0, but an expected artifact is missing or stale, or it stopped early
HUNG = 124  # `run`: stopped for a hang (proof that it cannot recover, or past its limit)
STOPPED = 125  # `run`: stopped on a finding named in --stop-on
SIGNAL_BASE = 128  # `run`: killed by signal N exits 128 + N, as shells say it


@dataclass(frozen=True)
class Row:
    code: str
    commands: str
    meaning: str


TABLE: tuple[Row, ...] = (
    Row(str(OK), "all", "a good end: `run` completed with no unacknowledged error finding; preflight passed; "
        "check and diagnose found no error"),
    Row("the command's own", "run", "crashed: the command exited non-zero (the first failing rank is named)"),
    Row(str(FINDINGS), "preflight, check, diagnose", "error findings"),
    Row(str(BAD_INPUT), "all", "bad input: an unknown run, option or command; one line on stderr"),
    Row(str(PREFLIGHT_INCOMPLETE), "preflight", "the script could not be fast-forwarded: what was not checked is listed"),
    Row(str(INTERNAL), "all", "trainguard itself failed (TRAINGUARD_DEBUG=1 shows the traceback)"),
    Row(str(CUT_OFF), "run", "cut off by its job scheduler (Slurm: a time limit, a preemption, a requeue, a node's "
        "failure; state `cut-off`) without the command saving a checkpoint after the scheduler's signal and exiting "
        "0 by itself; one that did (a warned job that saved and stopped) exits 0, so `--dependency=afterok` chains "
        "go on, and its state still says `cut-off`"),
    Row(str(HEALTH), "run", "completed, but with error findings (`--fail-on warning`: warnings too) nobody "
        "acknowledged; `--fail-on never` gives the command's own code"),
    Row(str(FAILED), "run", "exit 0, but an `--expect`ed artifact is missing or stale, or the script stopped early"),
    Row(str(HUNG), "run", "hung: stopped on proof that it cannot recover, or past its limit"),
    Row(str(STOPPED), "run", "stopped on a finding named in `--stop-on`"),
    Row(f"{SIGNAL_BASE}+N", "run", "killed by signal N (130: Ctrl-C, 137: SIGKILL, 143: SIGTERM)"),
)


def markdown_table() -> str:
    lines = ["| exit code | commands | meaning |", "|---|---|---|"]
    lines += [f"| {r.code} | {r.commands} | {r.meaning} |" for r in TABLE]
    return "\n".join(lines) + "\n"


def run_help() -> str:
    """The codes `trainguard run` gives, one short line each (its --help)."""
    rows = [r for r in TABLE if "run" in r.commands or r.commands == "all"]
    return "\n".join(f"{r.code}: {r.meaning}" for r in rows)


if __name__ == "__main__":
    print(markdown_table(), end="")
