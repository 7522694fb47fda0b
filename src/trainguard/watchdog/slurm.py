"""What the job scheduler knows of a run under Slurm: its time limit and end, its requeues, and why a signal came.

Read from the job's environment (`SLURM_JOB_ID`, `SLURM_RESTART_COUNT`, `SLURM_ARRAY_TASK_ID`,
`SLURMD_NODENAME`) and from `scontrol show job -o ID` (its `TimeLimit`, `StartTime`, `EndTime`,
`JobState`, `Reason`). Every call is bounded (a few seconds) and fail-open: a controller that does not
answer leaves what the environment says, never a stalled watchdog.

How Slurm ends a job (slurm.conf's KillWait, sbatch's --signal):
- at its time limit: SIGTERM to every process of the job, SIGKILL KillWait seconds later (30 s by default);
  `--signal=[B:]SIG@N` sends SIG about N seconds before the limit (Slurm may send it up to a minute early);
- preempted (PreemptMode=REQUEUE/CANCEL) or requeued: SIGTERM the same way; a requeued job starts again
  later with the same job id and `SLURM_RESTART_COUNT` one higher;
- `scancel`: SIGTERM (or the signal named), its state CANCELLED.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

QUERY_TIMEOUT = 5.0  # seconds: scontrol answers in milliseconds from a healthy controller
# A SIGTERM within this many seconds of the job's end is its time limit: slurmctld checks limits about
# every 30 s, so the signal may come that much later than EndTime, or early by its own clock's skew.
LIMIT_SLACK = 65.0
_DURATION = re.compile(r"^(?:(\d+)-)?(?:(\d+):)?(\d+)(?::(\d+))?$")


@dataclass(frozen=True)
class SlurmJob:
    """One Slurm job as this process sees it; times are Unix seconds, None where Slurm did not say."""

    job_id: str
    array_task: str | None = None
    restarts: int = 0
    time_limit_s: float | None = None  # None: UNLIMITED or unknown
    start: float | None = None
    end: float | None = None
    node: str | None = None  # this process's node (SLURMD_NODENAME)
    nodes: str | None = None  # the job's node list
    partition: str | None = None
    state: str | None = None
    reason: str | None = None

    def seconds_left(self, now: float) -> float | None:
        return None if self.end is None else self.end - now

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    def label(self) -> str:
        """`job 4182` or `job 4182_3` (an array task)."""
        return f"job {self.job_id}" + (f"_{self.array_task}" if self.array_task else "")


def job_from_env(env: Mapping[str, str] | None = None, query: bool = True) -> SlurmJob | None:
    """The Slurm job this process runs in (None outside Slurm), completed from scontrol when `query`."""
    env = os.environ if env is None else env
    job_id = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    if not job_id or not job_id.strip().isdigit():
        return None
    fields = scontrol_job(job_id) if query else {}
    return job_of(job_id.strip(), fields, env)


def job_of(job_id: str, fields: Mapping[str, str], env: Mapping[str, str]) -> SlurmJob:
    """A SlurmJob from scontrol's fields (may be empty) and the job's environment."""
    restarts = _int(fields.get("Restarts")) or _int(env.get("SLURM_RESTART_COUNT")) or 0
    end = parse_time(fields.get("EndTime")) or _float(env.get("SLURM_JOB_END_TIME"))
    start = parse_time(fields.get("StartTime")) or _float(env.get("SLURM_JOB_START_TIME"))
    return SlurmJob(
        job_id=job_id,
        array_task=env.get("SLURM_ARRAY_TASK_ID") or _none(fields.get("ArrayTaskId")),
        restarts=restarts,
        time_limit_s=parse_duration(fields.get("TimeLimit")),
        start=start,
        end=end,
        node=env.get("SLURMD_NODENAME") or None,
        nodes=_none(fields.get("NodeList")) or env.get("SLURM_JOB_NODELIST") or None,
        partition=_none(fields.get("Partition")) or env.get("SLURM_JOB_PARTITION") or None,
        state=_none(fields.get("JobState")),
        reason=_none(fields.get("Reason")),
    )


def scontrol_job(job_id: str, timeout: float = QUERY_TIMEOUT) -> dict[str, str]:
    """`scontrol show job -o ID` as a dict; empty when scontrol is missing, slow or says nothing."""
    exe = shutil.which("scontrol")
    if exe is None or not job_id.isdigit():
        return {}
    try:
        out = subprocess.run([exe, "show", "job", "-o", job_id], capture_output=True, text=True,
                             timeout=timeout, check=False, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return {}
    return parse_scontrol(out.stdout) if out.returncode == 0 else {}


def parse_scontrol(text: str) -> dict[str, str]:
    """`Key=Value Key=Value ...` of scontrol's one-line form; a value runs to the next ` Key=`."""
    fields: dict[str, str] = {}
    line = next((ln for ln in text.splitlines() if "JobId=" in ln), "")
    for m in re.finditer(r"(?:^|\s)([A-Za-z][A-Za-z0-9_:/]*)=(.*?)(?=\s[A-Za-z][A-Za-z0-9_:/]*=|$)", line):
        fields.setdefault(m.group(1), m.group(2).strip())
    return fields


def parse_time(text: str | None) -> float | None:
    """Slurm's `2026-12-06T04:05:16` (the controller's local time) as Unix seconds."""
    if not text or text in ("Unknown", "None", "N/A"):
        return None
    try:
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S").timestamp()
    except ValueError:
        return None


def parse_duration(text: str | None) -> float | None:
    """Slurm's `[D-]HH:MM:SS`, `MM:SS` or minutes as seconds; None for UNLIMITED or anything else."""
    if not text:
        return None
    m = _DURATION.match(text.strip())
    if m is None:
        return None
    days, a, b, c = (int(g) if g else None for g in m.groups())
    if a is None and c is None:  # "30": minutes
        return float((days or 0) * 86400 + (b or 0) * 60)
    if c is None:  # "MM:SS" (or D-HH:MM... Slurm writes D-HH:MM:SS in its output)
        hours, minutes, seconds = (0, a or 0, b or 0) if days is None else (a or 0, b or 0, 0)
    else:
        hours, minutes, seconds = a or 0, b or 0, c
    return float((days or 0) * 86400 + hours * 3600 + minutes * 60 + seconds)


def signal_cause(job: SlurmJob, signum: int, now: float, fields_now: Mapping[str, str]) -> str | None:
    """Why Slurm sent `signum`, from the job's state when it came: "time-limit", "time-limit-warning"
    (sbatch --signal before the limit), "preempted", "requeued", "cancelled" (scancel), or None (not the scheduler's
    as far as it says: a user's kill, or a controller that did not answer)."""
    state = (fields_now.get("JobState") or job.state or "").upper()
    reason = (fields_now.get("Reason") or "").lower()
    end = parse_time(fields_now.get("EndTime")) or job.end
    if state == "TIMEOUT":
        return "time-limit"
    if state == "PREEMPTED" or "preempt" in reason:
        return "preempted"
    if state == "NODE_FAIL" or "nodedown" in reason.replace("_", "") or "node_fail" in reason:
        return "node-failure"  # before "requeued": a job with --requeue is requeued after its node's failure
    restarts_now = _int(fields_now.get("Restarts"))
    if restarts_now is not None and restarts_now > job.restarts:
        return "requeued"  # counted as restarted the moment it is requeued, while still COMPLETING
    if state in ("REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD") or (state == "PENDING" and job.state == "RUNNING"):
        return "requeued"  # taken off its nodes and put back in the queue (scontrol requeue, a node's failure)
    if state == "CANCELLED":
        return "cancelled"
    if state in ("RUNNING", "COMPLETING", ""):
        left = None if end is None else end - now
        if left is not None and left <= LIMIT_SLACK and signum in (signal.SIGTERM, signal.SIGKILL):
            return "time-limit"
        if signum not in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGKILL) and left is not None:
            return "time-limit-warning"  # an extra signal while the job runs on: sbatch --signal's warning
    return None


def describe(cause: str) -> str:
    return {"time-limit": "reached its time limit", "time-limit-warning": "was warned of its time limit",
            "preempted": "was preempted (taken off its nodes for another job)",
            "requeued": "was requeued (taken off its nodes, to start again as its next attempt)",
            "cancelled": "was cancelled (scancel)", "node-failure": "lost a node"}.get(cause, cause)


@dataclass(frozen=True)
class NodeState:
    """One node as Slurm sees it: `scontrol show node`'s State and Reason (`Reason=test [root@2026-12-06T08:12:01]`)."""

    name: str
    state: str
    reason: str | None = None

    @property
    def failed(self) -> bool:
        """DOWN, FAIL(ING) or not responding (`IDLE*`): a node that cannot run the job's processes any more."""
        flags = set(re.split(r"[+*]", self.state.upper()))
        return bool(flags & {"DOWN", "FAIL", "FAILING", "NOT_RESPONDING"}) or self.state.endswith("*")


def hostnames(nodelist: str, timeout: float = QUERY_TIMEOUT) -> list[str]:
    """`tgn[1-2],gpu7` as ["tgn1", "tgn2", "gpu7"] (scontrol show hostnames); the list as given where it fails."""
    exe = shutil.which("scontrol")
    if exe is not None:
        out = _bounded([exe, "show", "hostnames", nodelist], timeout)
        if out:
            return out.split()
    return [n for n in nodelist.split(",") if n and "[" not in n and "]" not in n]


def node_state(name: str, timeout: float = QUERY_TIMEOUT) -> NodeState | None:
    """`scontrol show node -o NAME` as a NodeState; None where scontrol is missing, slow or does not know it."""
    exe = shutil.which("scontrol")
    if exe is None:
        return None
    return parse_node(_bounded([exe, "show", "node", "-o", name], timeout))


def parse_node(text: str) -> NodeState | None:
    line = next((ln for ln in text.splitlines() if "NodeName=" in ln), "")
    fields: dict[str, str] = {}
    for m in re.finditer(r"(?:^|\s)([A-Za-z][A-Za-z0-9_:/]*)=(.*?)(?=\s[A-Za-z][A-Za-z0-9_:/]*=|$)", line):
        fields.setdefault(m.group(1), m.group(2).strip())
    if not fields.get("NodeName"):
        return None
    reason = _none(fields.get("Reason"))
    if reason:
        reason = re.sub(r"\s*\[[^\]]*@[^\]]*\]\s*$", "", reason)  # "[root@2026-12-06T08:12:01]": who and when
    return NodeState(fields["NodeName"], fields.get("State") or "UNKNOWN", reason or None)


def sacct_nodes(job_id: str, timeout: float = QUERY_TIMEOUT) -> list[dict[str, str]]:
    """`sacct -j JOB --format=NodeList,State,Reason` rows (the job and its steps); [] without accounting."""
    exe = shutil.which("sacct")
    if exe is None or not job_id.isdigit():
        return []
    return parse_sacct(_bounded([exe, "-n", "-P", "-j", job_id, "--format=JobID,NodeList,State,Reason"], timeout))


def parse_sacct(text: str) -> list[dict[str, str]]:
    """sacct's parsable form (`-P`: `|` between fields, no header): JobID|NodeList|State|Reason."""
    rows = []
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) >= 4 and parts[0].strip():
            rows.append({"job": parts[0], "nodes": parts[1], "state": parts[2], "reason": parts[3]})
    return rows


def lost_nodes(job: SlurmJob, timeout: float = QUERY_TIMEOUT) -> list[NodeState]:
    """The job's nodes Slurm says failed (DOWN, FAIL, not responding), each with Slurm's own reason; sacct's
    NODE_FAIL rows name the nodes where scontrol no longer knows them. Bounded, fail-open: [] when nobody answers."""
    names = hostnames(job.nodes, timeout) if job.nodes else []
    lost = [n for n in (node_state(name, timeout) for name in names) if n is not None and n.failed]
    if lost:
        return lost
    for row in sacct_nodes(job.job_id, timeout):
        if row["state"].upper().startswith("NODE_FAIL") and row["nodes"] not in ("", "None assigned"):
            reason = _none(row["reason"])
            return [NodeState(name, "NODE_FAIL", reason) for name in hostnames(row["nodes"], timeout)]
    return []


def _bounded(argv: list[str], timeout: float) -> str:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False,
                             stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout if out.returncode == 0 else ""


def run_label(job: SlurmJob) -> str:
    """The run folder's name under Slurm: the same for a requeued job, so it continues that folder."""
    return f"slurm-{job.job_id}" + (f"_{job.array_task}" if job.array_task else "")


def _int(text: Any) -> int | None:
    try:
        return int(str(text).strip())
    except (TypeError, ValueError):
        return None


def _float(text: Any) -> float | None:
    try:
        return float(str(text).strip())
    except (TypeError, ValueError):
        return None


def _none(text: str | None) -> str | None:
    return None if text in (None, "", "(null)", "None", "N/A") else text
