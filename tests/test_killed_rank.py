"""A rank killed by SIGKILL (the OOM killer) under torchrun is the cause; its peers' "Connection closed/reset
by peer" and NCCL errors are consequences, whatever order the log prints them in.

The logs are generated here from torchrun's contract (torch/distributed/elastic/multiprocessing/api.py and
errors/__init__.py): the agent's "Sending process P closing signal SIGTERM", its "failed (exitcode: E)
local_rank: L (pid: P)" line for the earliest failure, the launcher's ChildFailedError traceback, then the
table: "Failures:" (one `[i]:` block per other rank) and "Root Cause (first observed failure):". A signal
writes no error file, so failures found in one poll tie to the second and the lowest rank is named root.
The real thing runs in tests/test_killed_rank_live.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainguard.rules.killedrank import killed_rank, killed_rank_finding

pytestmark = pytest.mark.unit

GLOO = ("RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
        "[127.0.0.1]:24993. This is typically caused by a remote worker crashing.")
RESET = "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:598] Connection reset by peer"
NCCL = ("torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, remote process exited or "
        "there was a network error, NCCL version 2.21.5")


def _peer(rank: int, error: str) -> list[str]:
    lines = ["Traceback (most recent call last):", '  File "/job/train.py", line 12, in <module>',
             "    dist.all_reduce(p.grad)", '  File "/venv/torch/distributed/distributed_c10d.py", line 3252, '
             "in all_reduce", "    work.wait()", error]
    return [f"[rank{rank}]: {line}" for line in lines]


def _block(i: int, rank: int, code: int, pid: int, when: str) -> list[str]:
    sig = {-9: "  (SIGKILL)", -15: "  (SIGTERM)"}.get(code, "")
    tb = (f"Signal {-code} ({sig.strip(' ()')}) received by PID {pid}" if code < 0
          else "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html")
    return [f"[{i}]:", f"  time      : {when}", "  host      : node-3", f"  rank      : {rank} (local_rank: {rank})",
            f"  exitcode  : {code} (pid: {pid}){sig}", "  error_file: <N/A>", f"  traceback : {tb}"]


def _torchrun_end(exits: list[tuple[int, int, int, str]], root: int, *, escalated: int | None = None) -> list[str]:
    """The agent's lines and the table for `exits` (rank, exit code, pid, time); `root` is the rank torchrun
    names first observed."""
    r = next(e for e in exits if e[0] == root)
    out = [f"W1206 07:32:01.608000 5185 torch/distributed/elastic/multiprocessing/api.py:1028] Sending process "
           f"{e[2]} closing signal SIGTERM" for e in exits if e[1] == -15]
    if escalated is not None:
        out.append(f"W1206 07:32:31.700000 5185 api.py:1047] Unable to shutdown process {escalated} via "
                   "Signals.SIGTERM, forcefully exiting via Signals.SIGKILL")
    out += [f"E1206 07:32:01.672000 5185 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: "
            f"{r[1]}) local_rank: {r[0]} (pid: {r[2]}) of binary: /venv/bin/python",
            "Traceback (most recent call last):", '  File "/venv/bin/torchrun", line 8, in <module>',
            "    sys.exit(main())", '  File "/venv/torch/distributed/launcher/api.py", line 383, in launch_agent',
            "    raise ChildFailedError(", "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
            "=" * 54, "train.py FAILED", "-" * 54, "Failures:"]
    others = [e for e in exits if e[0] != root]
    for i, e in enumerate(others, start=1):
        out += _block(i, *e)
    if not others:
        out.append("  <NO_OTHER_FAILURES>")
    return out + ["-" * 54, "Root Cause (first observed failure):"] + _block(0, *r) + ["=" * 54]


def _steps(n: int, ranks: int = 2) -> list[str]:
    return [f"[rank{r}]:step {s} loss {2.0 / (s + 1):.4f}" for s in range(n) for r in range(ranks)]


T = "2026-12-06_07:32:01"


def test_the_killed_rank_named_root_is_the_cause_and_the_peers_error_a_consequence() -> None:
    lines = _steps(20) + _peer(0, GLOO) + _torchrun_end([(0, -15, 5259, T), (1, -9, 5260, T)], root=1)
    f = killed_rank_finding(lines, step=19)
    assert f is not None and f.code == "TG503" and f.cause == "rank-killed"
    assert f.evidence["rank"] == 1 and f.evidence["pid"] == 5260 and f.evidence["rank_exit_code"] == -9
    assert f.summary.startswith("rank 1 was killed by SIGKILL"), f.summary
    assert "Connection closed by peer" in f.evidence["consequences"][0] and f.evidence["consequences"][0].startswith("rank 0")
    assert "Connection" not in f.summary.split(";")[0] and "5260" in f.fix


@pytest.mark.parametrize("killed,world", [(0, 2), (1, 3), (2, 3)])
def test_a_tie_that_torchrun_breaks_for_the_lowest_rank_still_blames_the_killed_one(killed: int, world: int) -> None:
    # the peers exited 1 (their collective raised) in the same poll as the killed rank: torchrun names the
    # lowest of them as its root cause; the killed rank is only in "Failures:"
    peers = [r for r in range(world) if r != killed]
    exits = [(r, 1, 5000 + r, T) for r in peers] + [(killed, -9, 5000 + killed, T)]
    exits.sort()
    lines = _steps(30, world)
    for r in peers:
        lines += _peer(r, RESET if r % 2 else NCCL)
    lines += _torchrun_end(exits, root=min(peers))
    f = killed_rank_finding(lines, step=29)
    assert f is not None and f.evidence["rank"] == killed, f and f.evidence
    assert "failure table" in f.evidence["root_cause_by"]
    assert {c.split(":")[0] for c in f.evidence["consequences"] if c.startswith("rank")} == {f"rank {r}" for r in peers}
    assert f.evidence["consequences"][-1].startswith("then torchrun's summary")


def test_the_peers_error_printed_after_the_summary_or_timestamps_out_of_order_change_nothing() -> None:
    end = _torchrun_end([(0, 1, 7, "2026-12-06_07:32:02"), (1, -9, 8, "2026-12-06_07:32:01")], root=1)
    for lines in (_peer(0, GLOO) + end, end + _peer(0, GLOO), end[:5] + _peer(0, GLOO) + end[5:]):
        e = killed_rank(lines)
        assert e is not None and e.rank == 1 and e.pid == 8


def test_a_rank_torchrun_itself_had_to_sigkill_is_not_the_cause() -> None:
    # rank 0 raised its own error; rank 1 ignored SIGTERM and torchrun escalated to SIGKILL after 30 s
    own = [f"[rank0]: {line}" for line in ["Traceback (most recent call last):",
                                           '  File "/job/train.py", line 40, in <module>',
                                           "    x = batch()", "ValueError: shard 3 is empty"]]
    lines = own + _torchrun_end([(0, 1, 7, T), (1, -9, 8, "2026-12-06_07:32:31")], root=0, escalated=8)
    assert killed_rank(lines) is None and killed_rank_finding(lines, step=5) is None


def test_a_rank_of_its_own_error_stays_the_cause_beside_a_killed_one() -> None:
    own = [f"[rank0]: {line}" for line in ["Traceback (most recent call last):",
                                           '  File "/job/train.py", line 40, in <module>',
                                           "    x = batch()", "ValueError: shard 3 is empty"]]
    lines = own + _torchrun_end([(0, 1, 7, T), (1, -9, 8, T)], root=0)
    assert killed_rank_finding(lines, step=5) is None


def test_the_agents_line_alone_names_the_killed_rank_when_the_table_was_cut() -> None:
    lines = _steps(5) + _peer(0, GLOO) + _torchrun_end([(0, -15, 7, T), (1, -9, 8, T)], root=1)[:2]
    f = killed_rank_finding(lines, step=4)
    assert f is not None and f.evidence["rank"] == 1 and f.evidence["pid"] == 8


def test_exit_137_through_a_shell_is_a_kill_and_a_healthy_or_crashed_table_is_not() -> None:
    assert killed_rank(_torchrun_end([(0, -15, 7, T), (1, 137, 8, T)], root=1)) is not None
    assert killed_rank(_torchrun_end([(0, -15, 7, T), (1, 1, 8, T)], root=1)) is None
    assert killed_rank(_steps(10)) is None


def test_diagnose_of_the_log_blames_the_killed_rank_in_every_variant(tmp_path: Path) -> None:
    from trainguard.ingest.detect import open_source
    from trainguard.ingest.diagnose import diagnose_source

    variants = {
        "root": _steps(20) + _peer(0, GLOO) + _torchrun_end([(0, -15, 5259, T), (1, -9, 5260, T)], root=1),
        "tie": _steps(20) + _peer(0, RESET) + _torchrun_end([(0, 1, 5259, T), (1, -9, 5260, T)], root=0),
        "after": _steps(20) + _torchrun_end([(0, -15, 5259, T), (1, -9, 5260, T)], root=1) + _peer(0, GLOO),
        "three": _steps(20, 3) + _peer(2, NCCL) + _peer(0, GLOO)
        + _torchrun_end([(0, 1, 1, T), (1, -9, 2, T), (2, 1, 3, T)], root=0),
    }
    for name, lines in variants.items():
        path = tmp_path / f"{name}.log"
        path.write_text("\n".join(lines) + "\n")
        d = diagnose_source(open_source(path))
        assert d.state == "killed", (name, d.state, [f.summary for f in d.findings])
        top = d.findings[0]
        assert top.code == "TG503" and top.evidence["rank"] == 1, (name, top.summary)
        assert not any(f.code == "TG501" for f in d.findings), name
        assert json.dumps(top.evidence["consequences"]).count("rank ") >= 1
