"""What trainguard reads of a Slurm job and concludes from it, on scontrol's own output written here from its
format (`Key=Value` pairs on one line, `[D-]HH:MM:SS` durations, local ISO times)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from trainguard import exitcodes
from trainguard.rules.scheduler import CUT_BY_SCHEDULER
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


def test_a_cut_is_a_warning_as_declared_and_its_fix_follows_its_cause() -> None:
    job = slurm.SlurmJob(job_id="4182", end=T0 + 60)
    lost = joblimit.cut_by_scheduler(job, "time-limit", signal_name="SIGTERM", step=750, total=19560,
                                     signalled_at=T0, checkpoints_after=[], last_checkpoint=None)
    saved = joblimit.cut_by_scheduler(job, "time-limit-warning", signal_name="SIGUSR1", step=750, total=19560,
                                      signalled_at=T0, checkpoints_after=[750], last_checkpoint=500, warned=True)
    unsaved = joblimit.cut_by_scheduler(job, "time-limit-warning", signal_name="SIGUSR1", step=750, total=19560,
                                        signalled_at=T0, checkpoints_after=[], last_checkpoint=500, warned=True)
    # `trainguard rules TG552` says what every emission is
    assert {lost.severity, saved.severity, unsaved.severity} == {CUT_BY_SCHEDULER.severity} == {"warning"}
    assert "no checkpoint was reported" in lost.summary and "(4%)" in lost.summary
    assert "--signal=B:USR1@120" in lost.fix  # not warned: ask for a warning
    assert "step 750" in saved.summary and "--signal" not in saved.fix and "step 750" in saved.fix
    assert "--signal" not in unsaved.fix and "save a checkpoint when guard.stop_requested" in unsaved.fix
    assert "step 500" in unsaved.fix  # what it can continue from


# `scontrol show node -o` of Slurm 22.05 (Debian 12), a node set DOWN by `scontrol update ... reason="test"`
NODE_DOWN = ("NodeName=tgn2 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=2 CPUTot=2 CPULoad=18.77 "
             "AvailableFeatures=(null) ActiveFeatures=(null) Gres=(null) NodeAddr=vm NodeHostName=vm Port=21139 "
             "Version=22.05.8 OS=Linux 6.18.44-fc-v1252 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=1000 AllocMem=0 "
             "FreeMem=13949 Sockets=2 Boards=1 State=DOWN ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A "
             "MCS_label=N/A Partitions=debug  BootTime=2026-12-06T03:47:01 SlurmdStartTime=2026-12-06T08:13:52 "
             "LastBusyTime=2026-12-06T08:13:52 CfgTRES=cpu=2,mem=1000M,billing=2 AllocTRES= CapWatts=n/a "
             "CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s "
             "Reason=test [root@2026-12-06T08:14:02]\n")


def test_a_down_node_is_read_with_slurms_reason() -> None:
    node = slurm.parse_node(NODE_DOWN)
    assert node == slurm.NodeState("tgn2", "DOWN", "test") and node.failed
    idle = slurm.parse_node(NODE_DOWN.replace("State=DOWN", "State=IDLE").replace(" Reason=test [root@2026-12-06T08:14:02]", ""))
    assert idle is not None and not idle.failed and idle.reason is None
    assert slurm.NodeState("n", "IDLE*").failed and slurm.NodeState("n", "MIXED+DRAIN+NOT_RESPONDING").failed
    assert not slurm.NodeState("n", "ALLOCATED+DRAIN").failed  # draining runs its jobs to their end
    assert slurm.parse_node("Node tgn9 not found\n") is None


def test_sacct_rows_of_a_node_failure() -> None:
    text = "4182|tgn[1-2]|NODE_FAIL|None\n4182.batch|tgn1|CANCELLED|\n4182.0|tgn[1-2]|CANCELLED by 0|\n"
    rows = slurm.parse_sacct(text)
    assert rows[0] == {"job": "4182", "nodes": "tgn[1-2]", "state": "NODE_FAIL", "reason": "None"}
    assert len(rows) == 3 and slurm.parse_sacct("") == []


def test_a_node_failure_is_node_lost_naming_the_node_and_the_reason() -> None:
    job = slurm.SlurmJob(job_id="4182", node="tgn1", nodes="tgn[1-2]")
    f = joblimit.node_failed(job, [slurm.NodeState("tgn2", "DOWN", "test")], signal_name="SIGTERM", step=37,
                             total=100, signalled_at=T0, last_checkpoint=30)
    assert f.code == "TG711" and f.cause == "node-failure" and f.where == "node tgn2"
    assert 'lost node tgn2 (Slurm says tgn2: DOWN, reason "test")' in f.summary and "step 30" in f.summary
    assert f.evidence["slurm_reasons"] == ["test"] and f.evidence["this_node"] == "tgn1"
    assert slurm.signal_cause(job, signal.SIGTERM, T0, {"JobState": "NODE_FAIL"}) == "node-failure"


def test_a_cut_is_its_own_state_not_a_kill() -> None:
    from trainguard.store.ending import ending_status
    from trainguard.watchdog import verdict

    job = slurm.SlurmJob(job_id="4182", end=T0 + 60)
    f = joblimit.cut_by_scheduler(job, "time-limit", signal_name="SIGTERM", step=750, total=19560,
                                  signalled_at=T0, checkpoints_after=[], last_checkpoint=None)
    v = verdict.cut_off("time-limit", -signal.SIGTERM, f, trainguard_exit=exitcodes.CUT_OFF)
    assert (v.state, v.signal, v.exit_code, v.trainguard_exit) == ("cut-off", "SIGTERM", -15, 121)
    saved = verdict.cut_off("time-limit-warning", 0, f, trainguard_exit=exitcodes.OK)
    assert saved.state == "cut-off" and saved.signal is None and saved.trainguard_exit == 0
    assert ending_status(saved.ending, step=750)["state"] == "cut-off"


class _Reader:
    def meta(self) -> dict:
        return {"plan": {"total_steps": 5000}}

    def events(self, kind: str) -> list:
        return []


def test_the_plan_is_not_projected_once_the_run_stopped_stepping_or_was_warned() -> None:
    from types import SimpleNamespace

    clock = [T0]
    job = slurm.SlurmJob(job_id="4182", end=T0 + 60)  # 5,000 steps at 0.1 s need 500 s; the job has 60
    stopped = joblimit.PlanVsTimeLimit(job, clock=lambda: clock[0])
    clock[0] = T0
    stopped.poll(SimpleNamespace(step=1, reader=_Reader(), scratch={}))
    clock[0] = T0 + 20
    # the step did not move since the last look (the run ended or stopped to save): nothing to project
    assert stopped.poll(SimpleNamespace(step=1, reader=_Reader(), scratch={})) == []
    warned = joblimit.PlanVsTimeLimit(job, clock=lambda: clock[0])
    warned.done = True  # what SlurmRun.on_signal does
    assert warned.poll(SimpleNamespace(step=500, reader=_Reader(), scratch={})) == []
    clock[0] = T0
    fresh = joblimit.PlanVsTimeLimit(job, clock=lambda: clock[0])
    found = []
    for i in range(1, 200):
        clock[0] = T0 + i * 0.1
        found += fresh.poll(SimpleNamespace(step=i, reader=_Reader(), scratch={}))
    assert [f.code for f in found] == ["TG551"]  # the same monitor, stepping: said once


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
    assert d.state == "cut-off" and cut.code == "TG503"  # a log's cut: run-killed, state cut-off
    assert "step 750 of 19,560 (3.8%)" in cut.summary and "26.3x the time" in cut.summary


def test_a_node_lost_through_the_store_names_its_slurm_node_and_slurms_reason() -> None:
    from trainguard.watchdog.nodes import node_lost_finding

    beat = {"t": T0, "step": 37, "host": "vm", "pid": 4, "run_dir": "/r/node-1", "slurm_node": "tgn2",
            "slurm_state": "DOWN*", "slurm_reason": "Not responding"}
    f = node_lost_finding(1, beat, silent=24, this_node=0, step=40, endpoint="10.0.0.1:29400")
    assert f.code == "TG711" and f.where == "node tgn2"
    assert "node 1 (Slurm node tgn2, host vm) lost" in f.summary
    assert 'Slurm says tgn2: DOWN*, reason "Not responding"' in f.summary
    assert f.evidence["slurm_reason"] == "Not responding"
    plain = node_lost_finding(1, {"t": T0, "step": 37, "host": "gpu-b"}, silent=24, this_node=0, step=40,
                              endpoint="10.0.0.1:29400")
    assert "node 1 (host gpu-b) lost" in plain.summary and "Slurm" not in plain.summary and plain.where == "node 1"


@pytest.mark.parametrize("epochs_line", [None, "Epoch 1/3"])
def test_a_cut_log_whose_step_counter_restarts_each_epoch_says_its_position(tmp_path, epochs_line) -> None:
    """`epoch 1 step 1300/8000`: the `/8000` is the epoch's steps, not the run's; with the epochs planned the
    position is in the run's steps, without them in the epoch's, and no projection of the whole plan."""
    from trainguard.ingest.diagnose import diagnose_path

    lines = [] if epochs_line is None else [epochs_line]
    lines += [f"[2026-11-02 01:{i // 60:02d}:{i % 60:02d}] epoch 1 step {i * 10}/8000 loss {3.2 - i * 0.008:.4f} "
              f"lr 3.0e-04" for i in range(1, 131)]
    lines.append("slurmstepd: error: *** JOB 812345 ON gpu017 CANCELLED AT 2026-11-02T01:54:10 DUE TO TIME LIMIT ***")
    log = tmp_path / "slurm-812345.out"
    log.write_text("\n".join(lines) + "\n")
    d = diagnose_path(log)
    cut = next(f for f in d.findings if f.cause == "time-limit")
    assert d.state == "cut-off"
    if epochs_line is None:
        assert "step 1,300 of 8,000 in epoch 1" in cut.summary and "x the time" not in cut.summary, cut.summary
    else:
        assert "step 1,300 of 24,000 (5.4%)" in cut.summary and "18.5x the time" in cut.summary, cut.summary


@pytest.mark.parametrize("sep", ["\r", "\n"])
def test_a_cut_log_of_bare_progress_bars_says_how_far_they_got(tmp_path, sep) -> None:
    """tqdm bars without metrics (Hugging Face's Trainer at logging_steps past the cut): the bar's position is
    where the run got, also when slurmstepd's line lands on the bar's own line."""
    from trainguard.ingest.diagnose import diagnose_path

    bars = sep.join(f" {2 * i}%|##        | {i}/50 [0:{i:02d}:00<7:00:00, 630.0{i}s/it]" for i in range(1, 12))
    text = ("***** Running training *****\n  Num Epochs = 1\n  Total optimization steps = 50\n" + bars +
            "slurmstepd: error: *** JOB 42221 ON clr1247 CANCELLED AT 2022-04-14T16:20:46 DUE TO TIME LIMIT ***\n")
    log = tmp_path / "slurm-42221.out"
    log.write_text(text)
    d = diagnose_path(log)
    cut = next(f for f in d.findings if f.cause == "time-limit")
    assert d.state == "cut-off" and "step 11 of 50 (22.0%)" in cut.summary, cut.summary
