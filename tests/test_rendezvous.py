"""TG712 rendezvous-incomplete, its pure parts: which stacks wait in a rendezvous, and what the finding says.

The end-to-end runs (a real init_process_group with world_size 2 and one process, torchrun --nnodes=2 with one
node, and the twin with both ranks) are zoo scenarios: rendezvous_*_noprobe, quiet_rendezvous_world_complete_noprobe.
    pytest -q -p no:xdist tests/test_rendezvous.py
"""

from __future__ import annotations

import pytest

from trainguard.findings import Finding
from trainguard.rules.crash import RUN_CRASHED
from trainguard.watchdog import rendezvous
from trainguard.watchdog.rendezvous import Waiter, crash_after_rendezvous, rendezvous_finding
from trainguard.watchdog.stacks import parse_faulthandler

pytestmark = pytest.mark.unit

SITE = "/venv/lib/python3.11/site-packages/torch/distributed"
# faulthandler's format (Python/traceback.c: "Thread 0x... (most recent call first):", then "  File ...")
RANK0 = f"""Thread 0x00007f0000000001 (most recent call first):
  File "{SITE}/rendezvous.py", line 199 in _create_c10d_store
  File "{SITE}/rendezvous.py", line 269 in _tcp_rendezvous_handler
  File "{SITE}/c10d_logger.py", line 95 in wrapper
  File "{SITE}/distributed_c10d.py", line 1702 in init_process_group
  File "/work/train.py", line 18 in <module>
"""
AGENT = f"""Thread 0x00007f0000000002 (most recent call first):
  File "{SITE}/elastic/rendezvous/static_tcp_rendezvous.py", line 67 in next_rendezvous
  File "{SITE}/elastic/agent/server/api.py", line 540 in _rendezvous
  File "{SITE}/run.py", line 900 in main
"""
TRAINING = f"""Thread 0x00007f0000000003 (most recent call first):
  File "{SITE}/distributed_c10d.py", line 2800 in all_reduce
  File "/work/train.py", line 30 in <module>
"""


def _waiting(text: str) -> tuple[str | None, str]:
    thread = parse_faulthandler(text)[0]
    return rendezvous._in_rendezvous(thread.frames)


def test_a_rank_in_its_c10d_store_and_an_agent_in_its_rendezvous_wait_and_a_collective_does_not() -> None:
    assert _waiting(RANK0)[0] == "rank" and "_create_c10d_store" in _waiting(RANK0)[1]
    assert _waiting(AGENT)[0] == "agent" and "next_rendezvous" in _waiting(AGENT)[1]
    assert _waiting(TRAINING) == (None, "")  # a hang in a collective is the stall machinery's, not this


def test_the_rank_finding_counts_the_missing_ranks_from_the_waiting_frames_arguments() -> None:
    w = Waiter(pid=10, kind="rank", frame="rendezvous.py:199 in _create_c10d_store", cmdline=["python", "train.py"],
               env={}, args={"world_size": "4", "rank": "0", "hostname": "'127.0.0.1'", "port": "29511"})
    f = rendezvous_finding([w], waiting_since=100.0, now=112.0, step=None)
    assert f.code == rendezvous.RENDEZVOUS_INCOMPLETE.code and f.severity == "warning"
    assert "at 127.0.0.1:29511 waits for 3 more ranks of 4 (world size 4; rank 0 started)" in f.summary
    assert "(12 s)" in f.summary and f.evidence["missing"] == 3 and "world_size" in f.fix


def test_the_agent_finding_reads_torchruns_options_from_its_command_line_or_environment() -> None:
    cmd = ["python", "-m", "torch.distributed.run", "--nnodes=3", "--node-rank", "0", "--master-addr", "10.0.0.1",
           "train.py", "--nnodes", "9"]  # (the script's own --nnodes is not torchrun's)
    w = Waiter(pid=11, kind="agent", frame="static_tcp_rendezvous.py:67 in next_rendezvous", cmdline=cmd,
               env={"PET_MASTER_PORT": "29600"})
    f = rendezvous_finding([w], waiting_since=0.0, now=15.0, step=None)
    assert "static rendezvous at 10.0.0.1:29600 waits for up to 2 more nodes of 3 (--nnodes=3; node 0 here)" \
        in f.summary
    assert "--node-rank" in f.fix


def test_a_crash_at_the_end_of_the_wait_names_the_rendezvous_and_a_crash_after_training_does_not() -> None:
    w = Waiter(pid=10, kind="rank", frame="x", cmdline=[], env={"WORLD_SIZE": "2", "RANK": "0"})
    wait = rendezvous_finding([w], waiting_since=0.0, now=12.0, step=None)
    crashed = Finding.of(RUN_CRASHED, step=None, summary="DistStoreError: Timed out after 31 seconds",
                         evidence={}, fix="Read the exception.", source="watchdog")
    crash_after_rendezvous(crashed, [wait])
    assert "waited in its rendezvous" in crashed.summary and crashed.fix.startswith("The ranks or nodes")
    later = Finding.of(RUN_CRASHED, step=40, summary="ValueError", evidence={}, fix="Read the exception.",
                       source="watchdog")
    assert crash_after_rendezvous(later, [wait]).summary == "ValueError"
