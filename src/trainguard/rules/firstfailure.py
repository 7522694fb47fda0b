"""Which process of a multi-process run failed first, read from its output alone (no probe in it).

A launcher (torchrun, `torch.multiprocessing.spawn`) puts every process's traceback in one stream, and one
failure brings the others down: rank 1 raises a ValueError, rank 0 dies of "Connection closed by peer" in
its next collective, the launcher sends SIGTERM to the rest and raises its own ChildFailedError last. The
last traceback is the least telling one. What the output carries, and what this module reads:

- the `[rank1]:` prefix torch puts on each line of a rank's output (torchrun's `[default1]:` with
  `--tee`), which says whose traceback is whose;
- the order the tracebacks arrived in (a launcher of one's own prints them unlabelled: a failure that
  reads as a consequence beside one that does not says there were several processes);
- torchrun's own summary, "Root Cause (first observed failure)": the rank, its exit code and pid, the
  time, and with `@record` the rank's traceback itself; `-- Process 1 terminated with the following
  error:` from `mp.spawn`.

The cause is the first failure that is neither a launcher's wrapper (ChildFailedError,
ProcessRaisedException) nor a consequence of another process's failure (a peer that closed the connection,
a collective that timed out or was aborted, a termination signal received); among those, the rank torchrun
names as its root cause when it names one. torchrun's choice alone is not enough: with no error file, two
failures seen in the same poll tie and it names the lowest rank. The others are listed as consequences.
One process's output (no rank prefixes, no launcher) is left to `crash.parse_traceback`: its last
traceback is its crash, and an earlier one was handled.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass, field

from trainguard.findings import Finding
from trainguard.rules.crash import (
    TEARDOWN_ABORT,
    TEARDOWN_EXPLAINED,
    TEARDOWN_FIX,
    ParsedTraceback,
    crash_finding,
    is_consequence,
    native_abort,
    parse_traceback,
)

_PREFIX = re.compile(r"^\[(?:rank|default|trainer|worker)(\d+)\]:\s?(.*)$")
_SPAWN_HEADER = re.compile(r"^-- Process (\d+) terminated with the following error:")
_ROOT_CAUSE = "Root Cause (first observed failure):"
_FIELD = re.compile(r"^\s*(time|host|rank|exitcode|error_file|traceback)\s*:\s?(.*)$")
_CHAINED = ("During handling of the above exception", "The above exception was the direct cause")
WRAPPERS = {"ChildFailedError", "ProcessRaisedException", "ProcessExitedException"}


@dataclass
class ProcessFailure:
    """One process's failure as the output shows it."""

    traceback: ParsedTraceback
    rank: int | None
    order: int
    """Where in the output it began: the order the failures arrived in."""

    @property
    def consequence(self) -> bool:
        return is_consequence(f"{self.traceback.exception}: {self.traceback.message}")


@dataclass
class RootCause:
    """torchrun's "Root Cause (first observed failure)" block."""

    rank: int | None = None
    exit_code: int | None = None
    pid: int | None = None
    time: str | None = None
    traceback: ParsedTraceback | None = None


@dataclass
class Failures:
    """Every failure the output of a run shows, and how many processes it spoke for."""

    failures: list[ProcessFailure] = field(default_factory=list)
    root: RootCause | None = None
    wrapped: bool = False
    """A launcher's wrapper (ChildFailedError, ProcessRaisedException) was seen: several processes ran."""

    @property
    def several_processes(self) -> bool:
        """Several processes failed: ranks told apart, a launcher's summary or wrapper, or a failure that
        reads as a consequence beside one that does not (a peer closed the connection: there was a peer)."""
        ranks = {f.rank for f in self.failures if f.rank is not None}
        kinds = {f.consequence for f in self.failures}
        return len(ranks) > 1 or self.root is not None or self.wrapped or kinds == {True, False}


def read_failures(lines: list[str]) -> Failures:
    """Every traceback in `lines` (a run's stderr), split by rank where the lines carry one."""
    streams: dict[int | None, list[tuple[int, str]]] = {}
    for i, raw in enumerate(lines):
        line = raw.rstrip("\n")
        m = _PREFIX.match(line)
        rank, text = (int(m.group(1)), m.group(2)) if m else (None, line)
        streams.setdefault(rank, []).append((i, text))
    out = Failures(root=_root_cause(lines))
    for rank, numbered in streams.items():
        for order, tb, spawned in _tracebacks(numbered):
            if tb.exception in WRAPPERS:
                out.wrapped = True
                continue
            out.failures.append(ProcessFailure(tb, rank if rank is not None else spawned, order))
    out.failures.sort(key=lambda f: f.order)
    if out.root is not None and out.root.traceback is not None \
            and not any(f.rank == out.root.rank for f in out.failures if f.rank is not None):
        # `@record` put the root cause's traceback in torchrun's summary; the rank's own lines are not here
        out.failures.append(ProcessFailure(out.root.traceback, out.root.rank, len(lines)))
    return out


def _tracebacks(numbered: list[tuple[int, str]]) -> list[tuple[int, ParsedTraceback, int | None]]:
    """(where it began, the traceback, the process `mp.spawn` named) for each failure in one stream; a
    chain ("During handling of the above exception ...") is one failure, its last exception the one raised."""
    texts = [t for _, t in numbered]
    starts = [j for j, t in enumerate(texts) if t.startswith("Traceback (most recent call last):")]
    out: list[tuple[int, ParsedTraceback, int | None]] = []
    for k, j in enumerate(starts):
        end = starts[k + 1] if k + 1 < len(starts) else len(texts)
        tb = parse_traceback(texts[j:end])
        if tb is None:
            continue
        before = [t for t in texts[max(0, j - 4):j] if t.strip()]
        spawned = next((int(m.group(1)) for t in before if (m := _SPAWN_HEADER.match(t))), None)
        if out and any(t.startswith(_CHAINED) for t in before):
            out[-1] = (out[-1][0], tb, out[-1][2])
            continue
        out.append((numbered[j][0], tb, spawned))
    return out


def _root_cause(lines: list[str]) -> RootCause | None:
    """torchrun's root-cause block, the last one in the output (a restarted job prints one per attempt)."""
    at = max((i for i, line in enumerate(lines) if _ROOT_CAUSE in line), default=None)
    if at is None:
        return None
    root = RootCause()
    tb_lines: list[str] | None = None
    for raw in lines[at + 1:at + 200]:
        line = raw.rstrip("\n")
        if line.startswith("=") or line.startswith("---"):
            break
        m = _FIELD.match(line) if tb_lines is None or not line.startswith("    ") else None
        if m is None:
            if tb_lines is not None:
                tb_lines.append(line)
            continue
        key, value = m.group(1), m.group(2).strip()
        if key == "rank":
            root.rank = _int(value.split()[0] if value else "")
        elif key == "exitcode":
            root.exit_code = _int(value.split()[0] if value else "")
            pid = re.search(r"pid:\s*(\d{1,10})\b", value)  # (a pid of thousands of digits is none: int() refuses it)
            root.pid = int(pid.group(1)) if pid else None
        elif key == "time":
            root.time = value
        elif key == "traceback" and value.startswith("Traceback (most recent call last):"):
            tb_lines = [value]
    if tb_lines:
        root.traceback = parse_traceback([tb_lines[0]] + textwrap.dedent("\n".join(tb_lines[1:])).splitlines())
    return root


def _int(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


def choose(failures: Failures) -> tuple[ProcessFailure | None, list[ProcessFailure], str] | None:
    """(the first failure, the later ones, how it was chosen), or None when the output shows no failure.
    The first failure is None when only torchrun's summary names it (its traceback is not in the output)."""
    found = failures.failures
    primary = [f for f in found if not f.consequence]
    root = failures.root
    if root is not None and root.rank is not None:
        named = [f for f in found if f.rank == root.rank]
        if named and (not named[0].consequence or not primary):
            first, how = named[0], "torchrun's root cause (first observed failure)"
        elif primary:
            first = primary[0]
            how = (f"the first traceback in the output that is not a consequence of another process's failure "
                   f"(torchrun named rank {root.rank}, whose failure "
                   f"{'reads as a consequence' if named else 'is not in the output'})")
        else:
            return None, found, "torchrun's root cause (first observed failure); its traceback is not in the output"
    elif found:
        first = (primary or found)[0]
        how = "the first traceback in the output"
        if primary and len(primary) < len(found):
            how += " that is not a consequence of another process's failure"
    else:
        return None
    return first, [f for f in found if f is not first], how


def first_failure_finding(lines: list[str], *, step: int | None, elapsed: float | None,
                          source: str = "watchdog") -> Finding | None:
    """TG501 run-crashed from a run's stderr: in a multi-process run the first process to fail is the
    cause and later failures are its consequences; in a single process, the last traceback. None when the
    output holds no traceback."""
    failures = read_failures(lines)
    if not failures.several_processes:
        parsed = parse_traceback(lines)
        if parsed is None:
            return None
        return crash_finding(exception=parsed.exception, message=parsed.message, frames=parsed.frames,
                             step=step, elapsed=elapsed, source=source)
    chosen = choose(failures)
    if chosen is None:
        return None
    first, later, how = chosen
    root = failures.root
    if first is None:
        assert root is not None
        abort = native_abort(lines) if root.exit_code == -6 else None  # -6: SIGABRT, the rank aborted
        if abort == TEARDOWN_ABORT:
            finding = crash_finding(exception="abort", message=TEARDOWN_EXPLAINED, frames=[], step=step,
                                    elapsed=elapsed, source=source)
            finding.fix = TEARDOWN_FIX
            finding.evidence["native_abort"] = abort
            finding.evidence["rank_exit_code"] = root.exit_code
        elif abort is not None:
            # no Python error: the C++ runtime's last words (NCCL's watchdog aborting after a device fault)
            kind, _, what = abort.partition(": ")
            finding = crash_finding(exception=kind.rsplit("::", 1)[-1], message=what or kind, frames=[], step=step,
                                    elapsed=elapsed, source=source)
            finding.evidence["native_abort"] = abort
            finding.evidence["rank_exit_code"] = root.exit_code
        else:
            finding = crash_finding(
                exception="ChildFailedError",
                message=f"exit code {root.exit_code}; its traceback is not in the output (its output went to a "
                        "log file, or was cut): decorate the entry point with "
                        "torch.distributed.elastic.multiprocessing.errors.record to have it in torchrun's summary",
                frames=[], step=step, elapsed=elapsed, source=source)
        rank: int | None = root.rank
    else:
        tb = first.traceback
        finding = crash_finding(exception=tb.exception, message=tb.message, frames=tb.frames, step=step,
                                elapsed=elapsed, source=source)
        rank = first.rank
    who = f"rank {rank}" if rank is not None else "a process (its rank is not in the output)"
    finding.evidence["rank"] = rank
    finding.evidence["root_cause_by"] = how
    if root is not None and root.rank == rank:
        finding.evidence.update({k: v for k, v in (("pid", root.pid), ("rank_exit_code", root.exit_code),
                                                   ("failed_at", root.time)) if v is not None})
    finding.evidence["consequences"] = [_consequence(f) for f in later]
    finding.summary = (f"{who} failed first: {finding.summary}"
                       + (f" ({len(later)} later failure(s) on other processes are consequences)" if later else ""))
    return finding


def _consequence(f: ProcessFailure) -> str:
    lines = f.traceback.message.splitlines()
    who = f"rank {f.rank}" if f.rank is not None else "a process"
    return f"{who}: {f.traceback.exception}: {(lines[0] if lines else '')[:200]}"

