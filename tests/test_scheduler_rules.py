"""What trainguard reads of a Slurm job and concludes from it, on scontrol's own output written here from its
format (`Key=Value` pairs on one line, `[D-]HH:MM:SS` durations, local ISO times)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from trainguard.watchdog import joblimit, slurm
from trainguard.watchdog.scheduler import catches

pytestmark = pytest.mark.unit

T0 = time.mktime((2026, 12, 6, 4, 0, 0, 0, 0, -1))


def scontrol_line(**fields: str) -> str:
    base = {"JobId": "4182", "JobName": "train job.sh", "UserId": "ana(1000)", "JobState": "RUNNING",
            "Reason": "None", "Restarts": "0", "TimeLimit": "01:00:00", "StartTime": "2026-12-06T04:00:00",
            "EndTime": "2026-12-06T05:00:00", "Partition": "gpu", "NodeList": "node[01-02]",
            "Command": "/home/ana/job.sh --lr 3e-4"}
    base.update(fields)
    return " ".join(f"{k}={v}" for k, v in base.items()) + "\n"


def test_scontrol_one_line_form_is_read_with_values_holding_spaces() -> None:
    f = slurm.parse_scontrol(scontrol_line())
    assert f["JobName"] == "train job.sh" and f["Command"] == "/home/ana/job.sh --lr 3e-4"
    assert f["EndTime"] == "2026-12-06T05:00:00" and f["NodeList"] == "node[01-02]"


@pytest.mark.parametrize(("text", "seconds"), [
    ("01:00:00", 3600), ("1-02:03:04", 93784), ("30", 1800), ("05:30", 330), ("2-00:00:00", 172800),
    ("UNLIMITED", None), ("", None), ("Partition_Limit", None)])
def test_slurm_durations(text: str, seconds: float | None) -> None:
    assert slurm.parse_duration(text) == seconds


def test_a_job_from_its_environment_and_scontrol() -> None:
    env = {"SLURM_JOB_ID": "4182", "SLURMD_NODENAME": "node01", "SLURM_ARRAY_TASK_ID": "3"}
    job = slurm.job_of("4182", slurm.parse_scontrol(scontrol_line(Restarts="2")), env)
    assert (job.time_limit_s, job.restarts, job.node, job.array_task) == (3600, 2, "node01", "3")
    assert job.end - job.start == 3600 and job.label() == "job 4182_3"
    assert slurm.job_from_env({}) is None and slurm.job_from_env({"SLURM_JOB_ID": "x; rm"}, query=False) is None


@pytest.mark.parametrize(("fields", "signum", "left", "cause"), [
    ({"JobState": "TIMEOUT"}, signal.SIGTERM, 0, "time-limit"),
    ({"JobState": "RUNNING"}, signal.SIGTERM, 20, "time-limit"),  # SIGTERM at the end: its limit
    ({"JobState": "RUNNING"}, signal.SIGTERM, 3000, None),  # mid-job SIGTERM, nothing says why: a kill
    ({"JobState": "RUNNING"}, signal.SIGUSR1, 120, "time-limit-warning"),
    ({"JobState": "PREEMPTED"}, signal.SIGTERM, 3000, "preempted"),
    ({"JobState": "COMPLETING", "Restarts": "1"}, signal.SIGTERM, 3000, "requeued"),
    ({"JobState": "PENDING", "Reason": "BeginTime", "Restarts": "1"}, signal.SIGTERM, 3000, "requeued"),
    ({"JobState": "CANCELLED"}, signal.SIGTERM, 3000, "cancelled"),
    ({}, signal.SIGTERM, 3000, None),  # the controller did not answer
])
def test_why_the_scheduler_sent_a_signal(fields: dict, signum: int, left: float, cause: str | None) -> None:
    job = slurm.SlurmJob(job_id="4182", end=T0 + 3600, state="RUNNING")
    assert slurm.signal_cause(job, signum, T0 + 3600 - left, fields) == cause


def test_the_plan_against_the_time_left_names_the_cut_and_the_last_checkpoint() -> None:
    job = slurm.SlurmJob(job_id="4182", start=T0, end=T0 + 3600, time_limit_s=3600)
    f = joblimit.plan_exceeds_time_limit(job, step=100, total=19560, rate=3.8, now=T0 + 400,
                                         checkpoints=[50, 100])
    assert f is not None and f.code == "TG551"
    # 3,200 s left at 3.8 s/step: 842 more steps -> step 942 of 19,560; checkpoints every 50 -> 900
    assert f.evidence["projected_cut_step"] == 942 and f.evidence["last_checkpoint_before_cut"] == 900
    assert "of 19,560" in f.summary and "--time=" in f.fix
    fits = joblimit.plan_exceeds_time_limit(job, step=100, total=900, rate=3.8, now=T0 + 400, checkpoints=[])
    assert fits is None  # 800 steps x 3.8 s = 3,040 s < 3,200 s left


def test_a_cut_without_a_checkpoint_is_an_error_and_with_one_a_warning() -> None:
    job = slurm.SlurmJob(job_id="4182", end=T0 + 60)
    lost = joblimit.cut_by_scheduler(job, "time-limit", signal_name="SIGTERM", step=750, total=19560,
                                     signalled_at=T0, checkpoints_after=[], last_checkpoint=None)
    saved = joblimit.cut_by_scheduler(job, "time-limit-warning", signal_name="SIGUSR1", step=750, total=19560,
                                      signalled_at=T0, checkpoints_after=[750], last_checkpoint=500)
    assert lost.severity == "error" and "no checkpoint was reported" in lost.summary and "(4%)" in lost.summary
    assert saved.severity == "warning" and "step 750" in saved.summary


def test_a_warning_signal_goes_only_to_a_process_that_catches_it() -> None:
    code = "import signal, time\nsignal.signal(signal.SIGUSR1, lambda *a: None)\nprint('ready', flush=True)\ntime.sleep(30)"
    catcher = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    plain = subprocess.Popen([sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(30)"],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert catcher.stdout is not None and plain.stdout is not None
        catcher.stdout.readline(), plain.stdout.readline()
        assert catches(catcher.pid, signal.SIGUSR1) and not catches(plain.pid, signal.SIGUSR1)
        assert not catches(os.getpid() + 10**7, signal.SIGUSR1)  # no such process: not caught
    finally:
        catcher.kill()
        plain.kill()


def test_a_log_its_scheduler_cut_says_how_much_of_the_plan_fit(tmp_path) -> None:
    """llm.c's step lines carry the plan (`step N/19560`); slurmstepd's last line says the time limit cut it."""
    from trainguard.ingest.diagnose import diagnose_path

    lines = [f"step {i}/19560 | loss {10.9 - i * 0.005:.4f} (+0.01z)| norm 0.9 | lr 6.00e-04 | 3800.00 ms" for i in range(1, 751)]
    lines.append("slurmstepd: error: *** JOB 4182 ON node07 CANCELLED AT 2026-01-01T10:00:00 DUE TO TIME LIMIT ***")
    log = tmp_path / "slurm-4182.out"
    log.write_text("\n".join(lines) + "\n")
    d = diagnose_path(log)
    cut = next(f for f in d.findings if f.cause == "time-limit")
    assert d.state == "cut-off" and cut.severity == "error"
    assert "step 750 of 19,560 (3.8%)" in cut.summary and "26.3x the time" in cut.summary
