"""Many nodes: two simulated nodes on localhost, each under its own `trainguard run` wrapping its torchrun
(`--nnodes=2 --node_rank=0|1`, a c10d rendezvous on 127.0.0.1), writing its part under one run folder.

- a healthy 2 x 2 job (2 nodes x 2 gloo ranks): both parts complete, quiet; `status`, `report` and
  `diagnose` read the two parts as one run (four ranks);
- a node whose agent is killed (its `trainguard run` and its torchrun, SIGKILL): the other node's watchdog
  finds it lost through the rendezvous store (TG711 node-lost).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from trainguard.store.reader import RunReader

SCRIPT = Path(__file__).parent / "scripts" / "ddp_nodes.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _node(run_dir: Path, node: int, port: int, steps: int, cwd: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "trainguard.cli", "run", "--quiet", "--run-dir", str(run_dir), "--",
           sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node_rank={node}", "--nproc_per_node=2",
           "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=tgtest", str(SCRIPT), str(steps)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINGUARD_")}
    return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainguard.cli", *args], capture_output=True, text=True, timeout=120)


def _kill_tree(proc: subprocess.Popen) -> None:
    try:
        procs = [psutil.Process(proc.pid)] + psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:
        procs = []
    for p in procs:
        try:
            p.kill()
        except psutil.Error:
            pass


def test_a_healthy_two_by_two_job_is_quiet_and_reads_back_as_one_run(tmp_path: Path) -> None:
    run = tmp_path / "run"
    port = _free_port()
    nodes = [_node(run, 0, port, 15, tmp_path), _node(run, 1, port, 15, tmp_path)]
    try:
        outs = [p.communicate(timeout=300)[0] for p in nodes]
    finally:
        for p in nodes:
            _kill_tree(p)
    assert [p.returncode for p in nodes] == [0, 0], "\n".join(o[-3000:] for o in outs)
    assert (run / "node-0" / "run.db").is_file() and (run / "node-1" / "run.db").is_file()

    st = json.loads(_cli("status", str(run), "--json").stdout)
    assert st["state"] == "completed"
    assert {n: v["state"] for n, v in st["nodes"].items()} == {"0": "completed", "1": "completed"}
    loud = [f"{f['code']} {f['name']} (node {f['node']}): {f['summary']}" for f in st["findings"]
            if f.get("severity") != "info"]
    assert not loud, loud
    with RunReader(run) as reader:
        assert {r["rank"] for r in reader.steps()} == {0, 1, 2, 3}
        assert reader.meta().get("command")  # the nodes' meta reads as one table
    assert _cli("report", str(run)).returncode == 0
    assert (run / "report.md").is_file()
    diag = _cli("diagnose", str(run))
    assert diag.returncode == 0, diag.stdout + diag.stderr


def test_a_node_whose_agent_is_killed_is_found_lost_by_the_other_node(tmp_path: Path) -> None:
    run = tmp_path / "run"
    port = _free_port()
    survivor = _node(run, 0, port, 400, tmp_path)
    victim = _node(run, 1, port, 400, tmp_path)
    orphans: list[psutil.Process] = []
    try:
        deadline = time.time() + 180
        while time.time() < deadline:  # both nodes train
            steps = {n: _step(run / f"node-{n}") for n in (0, 1)}
            if all(s is not None and s >= 15 for s in steps.values()):  # beats with a step went out
                break
            assert survivor.poll() is None and victim.poll() is None, "a node ended before the test could kill one"
            time.sleep(1)
        else:
            pytest.fail("the two nodes never trained")
        agent = [c for c in psutil.Process(victim.pid).children() if "torch.distributed.run" in " ".join(c.cmdline())]
        orphans = agent[0].children(recursive=True) if agent else []
        for p in [psutil.Process(victim.pid), *agent]:
            p.send_signal(signal.SIGKILL)  # the node's agent and its watchdog, gone at once
        killed_at = time.time()
        found = None
        while time.time() < killed_at + 90 and found is None:
            st = _status(run / "node-0")
            found = next((f for f in st.get("findings", []) if f.get("name") == "node-lost"), None)
            time.sleep(1)
        assert found is not None, f"node 0 never found node 1 lost: {_status(run / 'node-0')}"
        assert found["code"] == "TG711" and found["evidence"]["lost_node"] == 1
        assert "node 1" in found["summary"] and "127.0.0.1" in found["summary"]
        assert found["evidence"]["last_step"] is not None
    finally:
        for p in orphans:
            try:
                p.kill()
            except psutil.Error:
                pass
        for p in (victim, survivor):
            _kill_tree(p)
            p.wait(timeout=60)


def _step(node_dir: Path) -> int | None:
    try:
        with RunReader(node_dir) as reader:
            return max((b["step"] for b in reader.heartbeats() if b["step"] is not None), default=None)
    except Exception:
        return None


def _status(node_dir: Path) -> dict:
    try:
        return json.loads((node_dir / "status.json").read_text())
    except (OSError, ValueError):
        return {}
