"""The watchdog under a job scheduler (Slurm): where the run lives, the signals it passes on, how it ended.

The Supervisor asks this at five points and nowhere else:
- its run folder: `slurm-<job>` under the runs root when none is named, so a requeued job (same id, one
  more restart) continues the same folder as its next attempt, and `node-<N>` for one `trainguard run`
  per node under `srun`;
- a monitor projecting the plan against the job's end (TG551, watchdog/joblimit.py);
- the signals it passes on besides SIGINT/SIGTERM/SIGHUP: SIGUSR1/SIGUSR2, what `sbatch --signal` sends
  before the limit (unhandled, they would end the watchdog itself);
- a signal that came: recorded, and the script told (`RUN/stop-requested`, read by `guard.stop_requested`);
- the ending: why the scheduler sent it (time limit, preemption, cancel) and TG552 in place of run-killed.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

from trainguard.contract import STOP_REQUESTED_FILE
from trainguard.findings import Finding
from trainguard.watchdog import joblimit, slurm

WARNING_SIGNALS = tuple(s for s in (getattr(signal, "SIGUSR1", None), getattr(signal, "SIGUSR2", None))
                        if s is not None)


class SlurmRun:
    """What the watchdog knows of its Slurm job; one per `trainguard run`."""

    def __init__(self, job: slurm.SlurmJob, env: dict[str, str] | None = None) -> None:
        self.job = job
        self.env = dict(os.environ if env is None else env)
        self.signals: list[tuple[int, float]] = []  # (signal, when) in the order they came
        self.cause: str | None = None
        self._resolved = False

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
        return joblimit.PlanVsTimeLimit(self.job) if self.job.end is not None else None

    # -- signals ------------------------------------------------------------------------------------------

    def on_signal(self, signum: int, run_dir: Path) -> None:
        """In the signal handler: note it and tell the script; nothing that may block (no scontrol here)."""
        now = time.time()
        self.signals.append((signum, now))
        self._resolved = False
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
        """Why the last signal came, asked of the scheduler once per signal (bounded; off the handler)."""
        if self.signals and not self._resolved:
            self._resolved = True
            signum, when = self.signals[-1]
            self.cause = slurm.signal_cause(self.job, signum, time.time(), slurm.scontrol_job(self.job.job_id))
        return self.cause

    # -- the ending ---------------------------------------------------------------------------------------

    def ending(self, returncode: int, *, step: int | None, total: int | None,
               checkpoints: list[dict[str, Any]]) -> tuple[int, Finding | None]:
        """(the return code to judge, TG552 or None): a run the scheduler cut is killed by its signal even
        when the script caught it and exited 0 or 1 (it did not finish its plan on its own)."""
        cause = self.resolve()
        if cause is None or not self.signals:
            return returncode, None
        ending_signal = next((s for s, _ in reversed(self.signals) if s not in WARNING_SIGNALS), self.signals[-1][0])
        first_t = self.signals[0][1]
        steps = joblimit.checkpoint_steps(checkpoints)
        after = joblimit.checkpoint_steps([c for c in checkpoints if (c.get("t") or 0) >= first_t])
        before = [s for s in steps if s not in after]
        finding = joblimit.cut_by_scheduler(
            self.job, cause, signal_name=signal.Signals(ending_signal).name, step=step, total=total,
            signalled_at=first_t, checkpoints_after=after, last_checkpoint=before[-1] if before else None)
        reached_plan = bool(total) and step is not None and total is not None and step >= total
        if returncode >= 0 and not reached_plan:
            returncode = -ending_signal
        return returncode, finding

    def status(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": "slurm", **self.job.to_dict()}
        if self.cause:
            out["ended_by"] = self.cause
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
