"""A rank killed from outside (SIGKILL: the OOM killer, a person, a node agent) named as the cause of a
multi-process run's end, read from torchrun's own report; its peers' connection errors are consequences.

What torchrun's elastic agent prints (torch/distributed/elastic/multiprocessing/api.py and errors/__init__.py):
each poll collects every child that exited non-zero, timestamped to the second (no error file: a signal
writes none); the agent then sends the rest its closing signal ("Sending process P closing signal
SIGTERM"), escalates to SIGKILL itself only for one that outlives the grace period ("Unable to shutdown
process P via Signals.SIGTERM, forcefully exiting via Signals.SIGKILL"), logs "failed (exitcode: E)
local_rank: L (pid: P)" for the earliest failure, and raises ChildFailedError whose message is a table:
"Failures:" and "Root Cause (first observed failure):", one block per rank with `rank`, `exitcode : -9
(pid: P)  (SIGKILL)` and `traceback : Signal 9 (SIGKILL) received by PID P`.

A rank that died of SIGKILL the agent did not send was killed from outside, and killing it is what broke
its peers' collectives: their "Connection closed/reset by peer" (gloo) or NCCL errors come after it. The
root-cause block alone cannot say so: two children found in one poll tie to the second, and the lowest rank
(often the peer whose connection broke, exit code 1) is named. So the killed rank is the cause wherever the
table lists it, unless another rank failed of a cause of its own (a traceback that is not a lost peer).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from trainguard.findings import Finding

_BLOCK = re.compile(r"^\s*\[(\d+)\]:\s*$")
_FIELD = re.compile(r"^\s*(time|rank|exitcode|traceback)\s*:\s?(.*)$")
_EXITCODE = re.compile(r"^(-?\d{1,4})\b(?:\s*\(pid:\s*(\d{1,10})\))?")
_AGENT_FAILED = re.compile(r"failed \(exitcode: (-?\d{1,4})\) local_rank: (\d{1,6}) \(pid: (\d{1,10})\)")
_ESCALATED = re.compile(r"Unable to shutdown process (\d{1,10}) via \S+, forcefully exiting via \S*SIGKILL")
_SUMMARY = ("Failures:", "Root Cause (first observed failure):")
KILL_CODES = (-9, 137)  # SIGKILL as Popen reports it, and as a shell between the agent and python does (128 + 9)


@dataclass
class RankExit:
    """One rank's entry in torchrun's failure table (or the agent's `failed (exitcode ...)` line)."""

    rank: int | None
    exit_code: int
    pid: int | None = None
    time: str | None = None
    root: bool = False  # listed under "Root Cause (first observed failure)"
    line: int | None = None  # 1-based line of its block or line

    @property
    def killed(self) -> bool:
        return self.exit_code in KILL_CODES


def rank_exits(lines: list[str]) -> list[RankExit]:
    """Every rank's exit in torchrun's last failure table; the agent's `failed (exitcode ...)` line stands in
    when no table was printed (its output cut)."""
    starts = [i for i, line in enumerate(lines) if _SUMMARY[0] == line.strip()] \
        or [i for i, line in enumerate(lines) if _SUMMARY[1] in line]  # (an older torch: no "Failures:")
    out: list[RankExit] = []
    if starts:
        section_root = False
        current: RankExit | None = None
        for i in range(starts[-1], min(len(lines), starts[-1] + 2000)):
            text = lines[i].rstrip("\n")
            if _SUMMARY[1] in text:
                section_root = True
                continue
            if text.startswith("=") and i > starts[-1]:
                break
            if _BLOCK.match(text):
                current = RankExit(rank=None, exit_code=0, root=section_root, line=i + 1)
                out.append(current)
                continue
            m = _FIELD.match(text)
            if m is None or current is None:
                continue
            key, value = m.group(1), m.group(2).strip()
            if key == "rank":
                r = re.match(r"\d{1,6}\b", value)
                current.rank = int(r.group()) if r else None
            elif key == "exitcode":
                e = _EXITCODE.match(value)
                if e:
                    current.exit_code = int(e.group(1))
                    current.pid = int(e.group(2)) if e.group(2) else None
            elif key == "time":
                current.time = value[:40] or None
        out = [e for e in out if e.exit_code != 0]
    if not out:
        for i, line in enumerate(lines):
            m = _AGENT_FAILED.search(line)
            if m:  # the local rank: the global one on a single node, the only place torchrun's table is not
                out = [RankExit(rank=int(m.group(2)), exit_code=int(m.group(1)), pid=int(m.group(3)), root=True,
                                line=i + 1)]
    return out


def killed_rank(lines: list[str]) -> RankExit | None:
    """The rank killed by a SIGKILL torchrun did not send, the root-cause block's first, else the table's."""
    escalated = {int(m.group(1)) for line in lines if "forcefully exiting" in line
                 and (m := _ESCALATED.search(line))}
    killed = [e for e in rank_exits(lines) if e.killed and (e.pid is None or e.pid not in escalated)]
    killed.sort(key=lambda e: (not e.root, e.time or "", e.rank if e.rank is not None else 1 << 30))
    if not killed:
        return None
    first = killed[0]
    for i, line in enumerate(lines):  # the agent's own line for it, where it printed one, is where it shows first
        m = _AGENT_FAILED.search(line) if "failed (exitcode" in line else None
        if m and first.pid is not None and int(m.group(3)) == first.pid:
            first.line = i + 1
            break
    return first


def killed_rank_finding(lines: list[str], *, step: int | None, elapsed: float | None = None,
                        source: str = "watchdog") -> Finding | None:
    """TG503 run-killed naming the rank torchrun reports killed by SIGKILL, with every other rank's failure
    (a lost peer's traceback, the agent's closing signal) listed as a consequence. None when no rank was
    killed so, or when another rank failed of a cause of its own first (then that is the cause)."""
    from trainguard.rules.ending import RUN_KILLED
    from trainguard.rules.firstfailure import read_failures

    killed = killed_rank(lines)
    if killed is None:
        return None
    failures = read_failures(lines)
    others = [f for f in failures.failures if f.rank != killed.rank or f.rank is None]
    if any(not f.consequence and f.rank is not None for f in others):
        return None  # another rank raised an error of its own: a rank's traceback says more than a kill
    consequences = [f"rank {f.rank}: {f.traceback.exception}: {_first_line(f.traceback.message)[:200]}"
                    if f.rank is not None else f"a process: {f.traceback.exception}: "
                    f"{_first_line(f.traceback.message)[:200]}" for f in others if f.consequence]
    consequences += [f"rank {e.rank}: exit code {e.exit_code} (pid {e.pid}), after rank {killed.rank} was killed"
                     for e in rank_exits(lines) if e is not killed and e.rank != killed.rank]
    if failures.wrapped:
        consequences.append("then torchrun's summary: its ChildFailedError (the launcher's own traceback)")
    who = f"rank {killed.rank}" if killed.rank is not None else "a rank"
    pid = f", pid {killed.pid}" if killed.pid is not None else ""
    summary = (f"{who} was killed by SIGKILL (exit code {killed.exit_code}{pid}; torchrun: \"Signal 9 "
               f"(SIGKILL) received\"): most often the kernel's OOM killer, or a person or node agent")
    if consequences:
        summary += f"; {len(consequences)} failure(s) of the other ranks are consequences (they lost {who})"
    how = ("torchrun's root cause (first observed failure)" if killed.root else
           "torchrun's failure table: a rank killed by a SIGKILL torchrun did not send (its root cause, "
           "found in the same poll, is a peer that lost it)")
    evidence: dict[str, Any] = {"rank": killed.rank, "signal": "SIGKILL", "rank_exit_code": killed.exit_code,
                "root_cause_by": how, "consequences": consequences[:16]}
    evidence.update({k: v for k, v in (("pid", killed.pid), ("failed_at", killed.time),
                                       ("line", killed.line)) if v is not None})
    if elapsed is not None:
        evidence["elapsed"] = round(elapsed, 1)
    fix = (f"Find what killed {who}: `dmesg` or `journalctl -k` on its node for 'Out of memory: Killed process "
           f"{killed.pid if killed.pid is not None else '<pid>'}' (then reduce host memory: DataLoader workers x "
           "prefetch, a dataset cached in RAM, a leak), or the scheduler's or a person's kill; then resume from "
           "the last checkpoint. The other ranks' connection errors need no fix of their own.")
    return Finding.of(RUN_KILLED, step=step, summary=summary, evidence=evidence, fix=fix, cause="rank-killed",
                      source=source)


def _first_line(text: str) -> str:
    lines = text.splitlines()
    return lines[0] if lines else ""
