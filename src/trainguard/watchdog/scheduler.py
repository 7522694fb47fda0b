"""The watchdog under a job scheduler (Slurm): where the run lives, the signals it passes on, how it ended.

The Supervisor asks this at five points and nowhere else:
- its run folder: `slurm-<job>` under the runs root when none is named, so a requeued job (same id, one
  more restart) continues the same folder as its next attempt, and `node-<N>` for one `trainguard run`
  per node under `srun`;
- a monitor projecting the plan against the job's end (TG551, watchdog/joblimit.py);
- the signals it passes on besides SIGINT/SIGTERM/SIGHUP: SIGUSR1/SIGUSR2, what `sbatch --signal` sends
  before the limit (unhandled, they would end the watchdog itself);
- a signal that came: recorded, and the script told (`RUN/stop-requested`, read by `guard.stop_requested`);
- the ending: why the scheduler sent it (time limit, preemption, cancel, a node's failure): the state
  `cut-off`, TG552 (or TG711 naming the failed node and Slurm's reason) in place of run-killed.
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainguard import exitcodes
from trainguard.contract import STOP_REQUESTED_FILE
from trainguard.findings import Finding
from trainguard.watchdog import joblimit, slurm

WARNING_SIGNALS = tuple(s for s in (getattr(signal, "SIGUSR1", None), getattr(signal, "SIGUSR2", None))
                        if s is not None)


@dataclass
class Cut:
    """How the scheduler ended a run: its cause (time-limit, time-limit-warning, preempted, requeued, cancelled,
    node-failure), the signal that ended it, the finding (TG552, or TG711 for a node's failure), whether a
    checkpoint was saved after the first signal and the command then exited 0 by itself, and trainguard's
    exit code for it (exitcodes.py: 0 for such a saved segment, CUT_OFF otherwise)."""

    cause: str
    signum: int
    finding: Finding
    saved: bool
    exit_code: int


class SlurmRun:
    """What the watchdog knows of its Slurm job; one per `trainguard run`."""

    def __init__(self, job: slurm.SlurmJob, env: dict[str, str] | None = None) -> None:
        self.job = job
        self.env = dict(os.environ if env is None else env)
        self.signals: list[tuple[int, float]] = []  # (signal, when) in the order they came
        self.cause: str | None = None
        self._resolved = False
        self._monitor: joblimit.PlanVsTimeLimit | None = None

    @classmethod
    def detect(cls) -> SlurmRun | None:
        job = slurm.job_from_env()
        return cls(job) if job is not None else None

    # -- where the run lives --------------------------------------------------------------------------

    def folder_name(self, label: str) -> str:
        return f"{slurm.run_label(self.job)}-{label}"

    def node_part(self) -> int | None:
        """This node's part under `srun` over several nodes (one `trainguard run` per node), else None."""
        if not self.env.get("SLURM_STEP_ID") or _int(self.env.get("SLURM_NNODES")) in (None, 0, 1):
            return None
        return _int(self.env.get("SLURM_NODEID"))

    def clear_stop_request(self, run_dir: Path) -> None:
        """A new attempt starts unasked: an earlier attempt's request (a requeued job) is removed."""
        try:
            os.unlink(run_dir / STOP_REQUESTED_FILE)  # a planted link is removed, never followed
        except OSError:
            pass

    @property
    def attempt(self) -> int:
        return self.job.restarts

    def monitor(self) -> joblimit.PlanVsTimeLimit | None:
        self._monitor = joblimit.PlanVsTimeLimit(self.job) if self.job.end is not None else None
        return self._monitor

    # -- signals ------------------------------------------------------------------------------------------

    def on_signal(self, signum: int, run_dir: Path) -> None:
        """In the signal handler: note it and tell the script; nothing that may block (no scontrol here)."""
        now = time.time()
        self.signals.append((signum, now))
        self._resolved = False
        if self._monitor is not None:
            self._monitor.done = True  # the plan's projection is moot once the scheduler has spoken (TG551)
        try:
            fd = os.open(run_dir / STOP_REQUESTED_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        except OSError:
            return  # already told (an earlier signal), or the folder is gone: the signal still goes on
        with os.fdopen(fd, "w") as f:
            json.dump({"signal": signal.Signals(signum).name, "t": now, "job": self.job.job_id}, f)

    @staticmethod
    def pass_warning(signum: int, root_pid: int) -> list[int]:
        """Passes a warning signal on to the run's processes that catch it (Lightning's SLURMEnvironment
        catches SIGUSR1 to save and requeue); one that does not would be ended by it, which the warning is
        not for: that script learns of it through `guard.stop_requested`. Returns the pids signalled."""
        import psutil

        sent: list[int] = []
        try:
            root = psutil.Process(root_pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            return sent
        for p in procs:
            if catches(p.pid, signum):
                try:
                    os.kill(p.pid, signum)
                    sent.append(p.pid)
                except OSError:
                    pass
        return sent

    def resolve(self) -> str | None:
        """Why the last signal came, asked of the scheduler once per signal (bounded; off the handler).
        A node of the job that Slurm says failed (DOWN, FAIL, not responding) makes it a node's failure,
        whatever the job's own state says by then (a job with --requeue is already PENDING again)."""
        if self.signals and not self._resolved:
            self._resolved = True
            signum, when = self.signals[-1]
            self.cause = slurm.signal_cause(self.job, signum, time.time(), slurm.scontrol_job(self.job.job_id))
            if self.cause not in ("time-limit", "time-limit-warning", "preempted"):
                self.lost = slurm.lost_nodes(self.job)
                if self.lost:
                    self.cause = "node-failure"
        return self.cause

    lost: list[slurm.NodeState] = []

    # -- the ending ---------------------------------------------------------------------------------------

    def ending(self, returncode: int, *, step: int | None, total: int | None,
               checkpoints: list[dict[str, Any]]) -> Cut | None:
        """How the scheduler ended the run, or None when it did not (no signal, or the run completed its plan
        despite one). The run is cut off even when the script caught the signal and exited 0 or 1: it did
        not finish its plan on its own."""
        cause = self.resolve()
        if cause is None or not self.signals:
            return None
        reached_plan = bool(total) and step is not None and total is not None and step >= total
        if reached_plan and returncode == 0:
            return None
        ending_signal = next((s for s, _ in reversed(self.signals) if s not in WARNING_SIGNALS), self.signals[-1][0])
        first_t = self.signals[0][1]
        steps = joblimit.checkpoint_steps(checkpoints)
        after = joblimit.checkpoint_steps([c for c in checkpoints if (c.get("t") or 0) >= first_t])
        before = [s for s in steps if s not in after]
        warned = any(s in WARNING_SIGNALS for s, _ in self.signals)
        if cause == "node-failure":
            finding = joblimit.node_failed(self.job, self.lost, signal_name=signal.Signals(ending_signal).name,
                                           step=step, total=total, signalled_at=first_t,
                                           last_checkpoint=steps[-1] if steps else None)
        else:
            finding = joblimit.cut_by_scheduler(
                self.job, cause, signal_name=signal.Signals(ending_signal).name, step=step, total=total,
                signalled_at=first_t, checkpoints_after=after, last_checkpoint=before[-1] if before else None,
                warned=warned)
        # the command ended by itself after saving: a clean segment of a chain (afterok goes on); else a cut
        saved = bool(after) and returncode == 0
        return Cut(cause=cause, signum=ending_signal, finding=finding, saved=saved,
                   exit_code=exitcodes.OK if saved else exitcodes.CUT_OFF)

    def status(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": "slurm", **self.job.to_dict()}
        if self.cause:
            out["ended_by"] = self.cause
        if self.lost:
            out["lost_nodes"] = [{k: v for k, v in vars(n).items() if v is not None} for n in self.lost]
        return out


def catches(pid: int, signum: int) -> bool:
    """Whether process `pid` has a handler for `signum` (its SigCgt mask in /proc; False where unreadable)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def _int(text: Any) -> int | None:
    try:
        return int(str(text))
    except (TypeError, ValueError):
        return None
