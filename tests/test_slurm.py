"""trainguard under a real Slurm (tests/slurm_cluster.py starts one here: munged, slurmctld, two slurmd).

Jobs are submitted with sbatch/srun as a user would, each running `trainguard run -- python train.py`:
- a plan that cannot fit the job's --time: TG551 while the run goes on (and nothing stopped);
- a job warned before its limit (--signal): the script sees guard.stop_requested, saves, stops; the run
  ends killed by its scheduler (TG552, the checkpoint saved after the warning), not crashed;
- a job requeued: the same job id starts again and continues the same run folder as attempt 1;
- two "nodes" under srun: one run folder, a part per node, each naming its Slurm node.
Skipped with the reason where Slurm cannot start (not installed, not root).

Run: pytest -m slurm tests/test_slurm.py          (about 4 minutes: Slurm's own clocks set the pace)
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest
from slurm_cluster import SlurmCluster, unavailable

pytestmark = [pytest.mark.slurm, pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))]

ROOT = Path(__file__).resolve().parents[1]

TRAIN = textwrap.dedent("""
    import sys, time, torch, trainguard
    total, pace, out = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    guard = trainguard.watch(model, opt, total_steps=total)
    for step in range(1, total + 1):
        x = torch.randn(16, 8)
        loss = ((model(x) - x.sum(1, keepdim=True)) ** 2).mean()
        opt.zero_grad(); loss.backward(); opt.step(); guard.step(loss)
        print(f"step {step}/{total} loss {loss.item():.4f}", flush=True)
        time.sleep(pace)
        if guard.stop_requested:
            path = f"{out}/ckpt-{step}.pt"
            torch.save({"step": step, "model": model.state_dict()}, path)
            guard.checkpoint_saved(path)
            print(f"stop requested: saved {path}", flush=True)
            break
    guard.finish()
""")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    with SlurmCluster(tmp_path_factory.mktemp("slurm")) as c:
        yield c


def job_script(tmp: Path, run_dir: str | None, total: int, pace: float, *, launcher: str = "exec") -> str:
    (tmp / "train.py").write_text(TRAIN)
    run_dir_opt = f"--run-dir {run_dir} " if run_dir else ""
    return (f"#!/bin/bash\ncd {tmp}\nexport PYTHONPATH={ROOT / 'src'}${{PYTHONPATH:+:$PYTHONPATH}}\n"
            f"export TRAINGUARD_RUNS_ROOT={tmp / 'runs'}\n"
            f"{launcher} {sys.executable} -m trainguard.cli run {run_dir_opt}--stall-timeout 120 -- "
            f"{sys.executable} train.py {total} {pace} {tmp}\n")


def status(run_dir: Path) -> dict:
    try:
        return json.loads((run_dir / "status.json").read_text())
    except (OSError, ValueError):
        return {}


def codes(st: dict) -> list[str]:
    return [f["code"] for f in st.get("findings", [])]


def test_a_plan_that_cannot_fit_the_time_limit_is_said_while_the_run_goes_on(cluster: SlurmCluster,
                                                                               tmp_path: Path) -> None:
    run = tmp_path / "run"
    job = cluster.sbatch(job_script(tmp_path, str(run), total=5000, pace=0.05), "--time=1",
                         f"--output={tmp_path}/job.out")
    st = cluster.wait(lambda: (s := status(run)) and "TG551" in codes(s) and s, 90, "TG551 in status.json")
    f = next(f for f in st["findings"] if f["code"] == "TG551")
    assert st["state"] == "running", st["state"]  # said, never stopped
    assert f["evidence"]["job"] == job and 0 < f["evidence"]["projected_cut_step"] < 5000
    assert "--time=" in f["fix"] and "of 5,000" in f["summary"]
    assert st["scheduler"]["job_id"] == job and st["scheduler"]["time_limit_s"] == 60
    cluster.run("scancel", job)


def test_a_job_warned_before_its_limit_saves_and_ends_cut_by_its_scheduler(cluster: SlurmCluster,
                                                                            tmp_path: Path) -> None:
    run = tmp_path / "run"
    job = cluster.sbatch(job_script(tmp_path, str(run), total=100000, pace=0.05), "--time=1",
                         "--signal=B:USR1@45", f"--output={tmp_path}/job.out")
    st = cluster.wait(lambda: (s := status(run)) and s.get("ended") and s, 150, "the run's end")
    out = (tmp_path / "job.out").read_text()
    assert "stop requested: saved" in out, out[-2000:]
    # cut off by its scheduler, not killed: the script saved and stopped by itself, so trainguard exits 0 and
    # Slurm marks the job COMPLETED (an afterok chain goes on)
    assert st["state"] == "cut-off" and st["exit_code"] == 0, (st["state"], st["exit_code"], codes(st))
    f = next(f for f in st["findings"] if f["code"] == "TG552")
    assert f["cause"] == "time-limit-warning" and f["severity"] == "warning", f
    saved = f["evidence"]["checkpoints_after_signal"]
    assert saved and f"ckpt-{saved[-1]}.pt" in out, (f, out[-500:])
    assert "--signal" not in f["fix"] and "nothing to change" in f["fix"], f["fix"]
    assert not {"TG501", "TG503"} & set(codes(st)), codes(st)
    # the plan cannot fit (100,000 steps in a minute): TG551 may come, but only before the warning; after it
    # (or after the run stopped) the projection is moot
    late = [g for g in st["findings"] if g["code"] == "TG551" and g["t"] >= f["evidence"]["signalled_at"]]
    assert not late, late
    assert st["scheduler"]["ended_by"] == "time-limit-warning"
    state = cluster.wait(lambda: (j := cluster.job(job).get("JobState")) not in ("RUNNING", "COMPLETING") and j, 60,
                         "the job's end")
    assert state == "COMPLETED", state


def test_a_job_cut_at_its_time_limit_without_warning_is_cut_by_its_scheduler(cluster: SlurmCluster,
                                                                              tmp_path: Path) -> None:
    run = tmp_path / "run"
    cluster.sbatch(job_script(tmp_path, str(run), total=100000, pace=0.05), "--time=1",
                   f"--output={tmp_path}/job.out")
    st = cluster.wait(lambda: (s := status(run)) and s.get("ended") and s, 180, "the run's end")
    assert st["state"] == "cut-off" and st["signal"] == "SIGTERM", st
    f = next(f for f in st["findings"] if f["code"] == "TG552")
    assert f["cause"] == "time-limit" and f["severity"] == "warning", f
    assert "no checkpoint" in f["summary"] and "--signal=B:USR1@120" in f["fix"]


def test_a_requeued_job_continues_its_run_folder_as_the_next_attempt(cluster: SlurmCluster, tmp_path: Path) -> None:
    job = cluster.sbatch(job_script(tmp_path, None, total=60, pace=0.1), "--requeue", "--open-mode=append",
                         f"--output={tmp_path}/job.out")
    runs = tmp_path / "runs"
    run = cluster.wait(lambda: next(iter(runs.glob(f"slurm-{job}-*")), None), 60, "the job's run folder")
    assert run.name == f"slurm-{job}-train"
    cluster.wait(lambda: (status(run).get("step") or 0) >= 5, 60, "5 steps")
    cluster.run("scontrol", "requeue", job)
    first = cluster.wait(lambda: (s := status(run)) and s.get("ended") and s.get("attempt") == 0 and s, 60,
                         "the first attempt's end")
    assert first["state"] == "cut-off", first
    assert any(f["code"] == "TG552" and f["cause"] in ("requeued", "preempted") for f in first["findings"]), first
    # Slurm starts a requeued job again after its credential lifetime (about two minutes)
    last = cluster.wait(lambda: (s := status(run)) and s.get("attempt") == 1 and s.get("ended") and s, 300,
                        "attempt 1 to end")
    assert last["state"] == "completed", (last["state"], codes(last))
    assert last["scheduler"]["restarts"] == 1


def test_two_nodes_under_srun_write_one_run_with_their_node_names(cluster: SlurmCluster, tmp_path: Path) -> None:
    run = tmp_path / "run"
    script = job_script(tmp_path, str(run), total=20, pace=0.02, launcher="srun --ntasks-per-node=1")
    cluster.sbatch(script, "-N2", f"--output={tmp_path}/job.out")
    cluster.wait(lambda: all(status(run / f"node-{n}").get("ended") for n in (0, 1)), 120, "both nodes' ends")
    nodes = {status(run / f"node-{n}")["scheduler"]["node"] for n in (0, 1)}
    assert nodes == {"tgn1", "tgn2"}
    from trainguard.store.nodes import merged_status

    merged = merged_status(run)
    assert merged["state"] == "completed", merged


def test_preflight_in_a_job_says_the_plan_cannot_fit_its_time_limit(cluster: SlurmCluster, tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(TRAIN)
    run = tmp_path / "pre"
    script = (f"#!/bin/bash\ncd {tmp_path}\nexport PYTHONPATH={ROOT / 'src'}${{PYTHONPATH:+:$PYTHONPATH}}\n"
              f"exec {sys.executable} -m trainguard.cli preflight --run-dir {run} -- "
              f"{sys.executable} train.py 5000 0.05 {tmp_path}\n")
    cluster.sbatch(script, "--time=1", f"--output={tmp_path}/job.out")
    st = cluster.wait(lambda: (s := status(run)) and s.get("ended") and s, 120, "the preflight's end")
    out = (tmp_path / "job.out").read_text()
    f = next((f for f in st.get("findings", []) if f["code"] == "TG551"), None)
    assert f is not None, out[-3000:]
    assert f["source"] == "preflight" and f["evidence"]["total_steps"] == 5000
    assert "TG551" in out


def test_a_plan_that_fits_its_time_limit_stays_quiet(cluster: SlurmCluster, tmp_path: Path) -> None:
    """TG551's healthy twin: the same script, a plan that fits the job's --time with room to spare."""
    run = tmp_path / "run"
    cluster.sbatch(job_script(tmp_path, str(run), total=300, pace=0.05), "--time=3", f"--output={tmp_path}/job.out")
    st = cluster.wait(lambda: (s := status(run)) and s.get("ended") and s, 120, "the run's end")
    assert st["state"] == "completed" and st["exit_code"] == 0, (st["state"], codes(st))
    assert not {"TG551", "TG552"} & set(codes(st)), codes(st)
    assert st["scheduler"]["time_limit_s"] == 180


def test_a_node_set_down_mid_job_is_node_lost_with_its_name_and_slurms_reason(cluster: SlurmCluster,
                                                                               tmp_path: Path) -> None:
    """Two "nodes" under srun; tgn2 stops answering (its slurmd stopped) and is set DOWN with a reason while
    the job trains: Slurm ends the job (NODE_FAIL) and the surviving node's part names tgn2 and Slurm's
    reason, "test". (A node set DOWN whose slurmd still answers is back in service within milliseconds here,
    ReturnToService=2: the job is then only requeued, and nothing names the node any more.)"""
    run = tmp_path / "run"
    script = job_script(tmp_path, str(run), total=100000, pace=0.05, launcher="srun --ntasks-per-node=1")
    job = cluster.sbatch(script, "-N2", "--no-requeue", f"--output={tmp_path}/job.out")
    cluster.wait(lambda: all((status(run / f"node-{n}").get("step") or 0) >= 5 for n in (0, 1)), 90,
                 "5 steps on both nodes")
    parts = {status(run / f"node-{n}")["scheduler"]["node"]: run / f"node-{n}" for n in (0, 1)}
    try:
        cluster.stop_slurmd("tgn2")
        cluster.run("scontrol", "update", "nodename=tgn2", "state=down", "reason=test")
        st = cluster.wait(lambda: (s := status(parts["tgn1"])) and s.get("ended") and s, 90, "tgn1's part to end")
        node = cluster.run("scontrol", "show", "node", "-o", "tgn2").stdout
    finally:
        cluster.start_slurmd("tgn2")
        cluster.wait(lambda: "tgn2" in cluster.run("scontrol", "show", "node", "-o", "tgn2", check=False).stdout, 30,
                     "tgn2 to register")
        cluster.run("scontrol", "update", "nodename=tgn2", "state=resume", check=False)
        _end_part(cluster, parts["tgn2"])
    out = (tmp_path / "job.out").read_text()
    assert st["state"] == "cut-off", (st["state"], codes(st), out[-2000:])
    f = next((f for f in st["findings"] if f["code"] == "TG711"), None)
    assert f is not None, (codes(st), st.get("scheduler"), node, out[-2000:])
    assert f["cause"] == "node-failure" and f["evidence"]["lost_nodes"] == ["tgn2"], f
    assert f["evidence"]["slurm_reasons"] == ["test"] and 'reason "test"' in f["summary"], f
    assert st["scheduler"]["ended_by"] == "node-failure"
    assert st["scheduler"]["lost_nodes"] == [{"name": "tgn2", "state": f["evidence"]["node_states"][0], "reason": "test"}]
    assert not {"TG501", "TG503", "TG552"} & set(codes(st)), codes(st)
    state = cluster.wait(lambda: (j := cluster.job(job).get("JobState")) not in ("RUNNING", "COMPLETING") and j, 60,
                         "the job's end")
    assert state == "NODE_FAIL", state


def _end_part(cluster: SlurmCluster, part: Path) -> None:
    """The lost node's part, cut off from its controller, ends when its slurmd comes back and is told the job
    is gone; if it does not, its watchdog (this test's own process) is stopped here."""
    import os
    import signal as signals

    try:
        cluster.wait(lambda: status(part).get("ended"), 30, "the lost node's part to end")
    except AssertionError:
        pid = (status(part).get("owner") or {}).get("pid")
        if isinstance(pid, int):
            try:
                os.kill(pid, signals.SIGTERM)
            except OSError:
                pass
