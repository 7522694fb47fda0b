"""Collectives counted per rank (probe/collectives.py) and compared across ranks (watchdog/collectives.py).

The probe side runs a real one-rank gloo process group in a child process (the wrappers are process-wide);
the judging side is plain data: positions as the probe stores them. The whole path, two ranks under
torchrun and a real hang, is the zoo's torchrun_collective_mismatch (and its twin).
"""

from __future__ import annotations

import json
import subprocess
import sys

from trainguard.watchdog.collectives import judge, read_positions

CHILD = r"""
import json, os, socket
import torch, torch.distributed as dist
from trainguard.probe import collectives
with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
assert collectives.install() and collectives.install()  # idempotent
assert collectives.position() is None
t = torch.ones(2)
for _ in range(3):
    dist.all_reduce(t)
seen = [collectives.changed(), collectives.changed()]
out = [None] * 1
dist.all_gather_object(out, {"a": 1})  # calls all_gather inside: counted once, as itself
dist.barrier()
sub = dist.new_group([0])
dist.broadcast(t, src=0, group=sub)
print(json.dumps({"seen": seen, "last": collectives.position(),
                  "default": collectives._counts.get("default"), "groups": len(collectives._counts)}))
dist.destroy_process_group()
"""


def test_probe_numbers_each_collective_per_group_and_counts_outermost_calls_only() -> None:
    proc = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    first, again = got["seen"]
    assert first["op"] == "all_reduce" and first["seq"] == 3 and first["inside"] is False
    assert first["ops"] == {"all_reduce": 3}
    assert again is None  # nothing moved since: the flusher writes nothing
    assert got["default"] == 5  # 3 all_reduce + all_gather_object (its inner all_gather not counted) + barrier
    last = got["last"]
    assert last["op"] == "broadcast" and last["seq"] == 1 and last["group"] != "default"
    assert got["groups"] == 2


def _at(op: str, seq: int, inside: bool = True, **ops: int) -> dict:
    return {"op": op, "seq": seq, "inside": inside, "ops": ops}


def test_a_different_collective_at_the_same_number_blames_the_rank_that_calls_a_new_one() -> None:
    v = judge({0: _at("all_reduce", 36, all_reduce=36), 1: _at("broadcast", 36, all_reduce=35, broadcast=1)},
              {0: "all_reduce", 1: "broadcast"})
    assert v["sentence"] == "rank 1 waits in broadcast #36 while rank 0 is in all_reduce #36"
    assert v["blame"] == 1
    assert "different collectives" in v["unrecoverable"]


def test_one_rank_behind_the_others_is_blamed_and_the_ranks_are_named_as_a_range() -> None:
    positions = {r: _at("all_reduce", 1043) for r in range(3)} | {3: _at("all_reduce", 1042)}
    v = judge(positions, {})
    assert v["sentence"] == "rank 3 waits in all_reduce #1042 while ranks 0\u20132 are in #1043"
    assert v["blame"] == 3 and v["unrecoverable"]


def test_a_rank_in_no_collective_is_blamed_but_is_no_proof() -> None:
    # it may be a straggler still computing its way there: the stop policy waits for the limit
    v = judge({0: _at("all_reduce", 18), 1: _at("all_reduce", 18), 2: _at("all_reduce", 17, inside=False)},
              {0: "all_reduce", 1: "all_reduce", 2: None})
    assert v["sentence"].startswith("rank 2 is in no collective (its last: all_reduce #17, finished)")
    assert v["blame"] == 2 and v["unrecoverable"] is None


def test_ranks_in_the_same_collective_blame_nobody() -> None:
    v = judge({0: _at("all_reduce", 18), 1: _at("all_reduce", 18)}, {0: "all_reduce", 1: "all_reduce"})
    assert v["blame"] is None and v["unrecoverable"] is None
    assert "same collective, all_reduce #18" in v["sentence"]


def test_the_stack_wins_over_a_position_it_contradicts_and_no_counters_means_no_verdict(tmp_path) -> None:
    # the counter says inside, the stack says the rank left: trust the stack (the counter may be late)
    v = judge({0: _at("all_reduce", 5), 1: _at("all_reduce", 5)}, {0: "all_reduce", 1: None})
    assert v["blame"] == 1
    assert judge({}, {0: "all_reduce", 1: "barrier"}) is None
    assert read_positions(tmp_path) == {}  # no store: the stacks alone name the collectives


def test_a_nodes_part_reads_the_positions_of_every_nodes_ranks(tmp_path) -> None:
    from trainguard.store.writer import StoreWriter

    for node, ranks in ((0, (0, 1)), (1, (2, 3))):
        (tmp_path / f"node-{node}").mkdir()
        for rank in ranks:
            w = StoreWriter(tmp_path / f"node-{node}", rank=rank)
            w.set_meta(f"collectives.{rank}", _at("all_reduce", 1042 if rank == 3 else 1043, all_reduce=1))
            w.flush()
            w.close()
    positions = read_positions(tmp_path / "node-0")
    assert sorted(positions) == [0, 1, 2, 3]
    v = judge(positions, {0: "all_reduce", 1: "all_reduce"})  # stacks of this node's ranks only
    assert v["sentence"] == "rank 3 waits in all_reduce #1042 while ranks 0\u20132 are in #1043"
