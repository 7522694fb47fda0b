"""Collectives counted per rank (probe/collectives.py) and compared across ranks (watchdog/collectives.py).

The probe side runs a real one-rank gloo process group in a child process (the wrappers are process-wide);
the judging side is plain data: positions as the probe stores them. The whole path, two ranks under
torchrun and a real hang, is the zoo's torchrun_collective_mismatch (and its twin).
"""

from __future__ import annotations

import json
import subprocess
import sys

from trainguard.probe import flightrec
from trainguard.watchdog.collectives import judge, judge_flight, read_positions

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


# -- the flight recorder's view (probe/flightrec.py answers; watchdog/collectives.judge_flight compares) --


def _fr(groups: dict, active: list, kinds: dict, members: dict | None = None) -> dict:
    return {"groups": {g: {"enqueued": e, "completed": c} for g, (e, c) in groups.items()}, "active": active,
            "kinds": kinds, "members": members or {g: [0, 1] for g in groups}}


def _act(group: str, seq: int, origin: str, where: str, op: str = "all_reduce", sizes: list | None = None) -> dict:
    return {"group": group, "seq": seq, "op": op, "sizes": sizes or [[161]], "from": origin, "where": where}


# rank 0 made an extra all-reduce on a metrics group ("1") after step 12's backward; rank 1 went on into
# the next backward, where DDP's all-reduce (#19 of the default group) waits for rank 0
EXTRA = {
    0: _fr({"default": (18, 18), "1": (1, -1)}, [_act("1", 1, "python", "train.py:63 (<module>)", sizes=[[]])],
           {"default": {"all_reduce [161]": 13, "broadcast [5]": 1}, "1": {"all_reduce []": 1}}),
    1: _fr({"default": (19, 18)}, [_act("default", 19, "backward", "train.py:57 (<module>)")],
           {"default": {"all_reduce [161]": 14, "broadcast [5]": 1}}, {"default": [0, 1], "1": [0, 1]})
    | {"step": 14},
}


def test_an_extra_collective_on_one_rank_against_ddps_all_reduce_is_proof_and_blames_the_extra_call() -> None:
    v = judge_flight(EXTRA, {0: "python", 1: "backward"})
    assert v["blame"] == 0 and v["unrecoverable"]
    assert v["sentence"] == ("rank 0 waits in all_reduce #1 of group 1 at train.py:63 (<module>), which rank 1 never "
                             "called; rank 1 waits in DDP's gradient all-reduce (all_reduce #19, in step 14's backward at "
                             "train.py:57 (<module>)), which rank 0 has not reached")


def test_a_rank_slow_in_backward_while_the_other_waits_in_ddps_all_reduce_is_no_proof() -> None:
    # the healthy twin: rank 1 still computes its backward (no bucket issued yet), rank 0 waits for it
    fr = {0: _fr({"default": (19, 18)}, [_act("default", 19, "backward", "train.py:57 (<module>)")],
                 {"default": {"all_reduce [161]": 14}}),
          1: _fr({"default": (18, 18)}, [], {"default": {"all_reduce [161]": 13}})}
    v = judge_flight(fr, {0: "backward", 1: "backward"})
    assert v["unrecoverable"] is None and v["blame"] == 1 and v["straggling"] == [1]
    assert v["sentence"].startswith("rank 1 is in no collective yet")


def test_a_rank_with_a_bucket_out_may_still_issue_the_next_one_the_other_waits_for() -> None:
    # rank 0 waits in bucket #20; rank 1 issued #19 and is still computing the gradients of #20: not proof
    fr = {0: _fr({"default": (20, 18)}, [_act("default", 20, "backward", "a"), _act("default", 19, "backward", "a")],
                 {}),
          1: _fr({"default": (19, 18)}, [_act("default", 19, "backward", "a")], {})}
    assert judge_flight(fr, {0: "backward", 1: "backward"})["unrecoverable"] is None


def test_ranks_in_different_ops_at_the_same_number_of_a_group_is_proof() -> None:
    fr = {0: _fr({"default": (36, 35)}, [_act("default", 36, "python", "a", sizes=[[]])], {}),
          1: _fr({"default": (36, 35)}, [_act("default", 36, "python", "b", op="broadcast", sizes=[[]])], {})}
    v = judge_flight(fr, {0: "python", 1: "python"})
    assert v["unrecoverable"] and "same number" in v["unrecoverable"]


def test_a_rank_without_an_answer_leaves_the_judgement_to_the_counters() -> None:
    assert judge_flight({0: EXTRA[0]}, {0: "python", 1: "backward"}) is None


def test_a_rank_outside_the_group_of_the_waited_collective_does_not_count_as_missing() -> None:
    # ranks 0 and 1 wait in group "1" (members 0, 1) at the same number; rank 2 is elsewhere: no proof, and
    # rank 2 is named as the one outside any collective, not as missing from group 1
    act = [_act("1", 4, "python", "a", sizes=[[]])]
    fr = {r: _fr({"default": (9, 9), "1": (4, 3)}, act, {}, {"default": [0, 1, 2], "1": [0, 1]}) for r in (0, 1)}
    fr[2] = _fr({"default": (9, 9)}, [], {}, {"default": [0, 1, 2], "1": [0, 1]})
    v = judge_flight(fr, {0: "python", 1: "python", 2: None})
    assert v["unrecoverable"] is None and v["blame"] == 2


def test_flight_recorder_frames_name_who_issued_a_collective() -> None:
    backward = [{"filename": "/x/site-packages/torch/autograd/graph.py", "line": 979, "name": "_engine_run_backward"},
                {"filename": "/tmp/train.py", "line": 27, "name": "<module>"}]
    python = [{"filename": "/x/site-packages/torch/distributed/distributed_c10d.py", "line": 3245, "name": "all_reduce"},
              {"filename": "/x/site-packages/torch/distributed/c10d_logger.py", "line": 83, "name": "wrapper"},
              {"filename": "/tmp/train.py", "line": 31, "name": "<module>"}]
    assert flightrec.origin(backward) == "backward" and flightrec.origin(python) == "python"
    assert flightrec.origin([]) == "other"
    assert flightrec._user_where(python) == "/tmp/train.py:31 (<module>)"
    assert flightrec.kind_of("all_reduce", [[161]]) == "all_reduce [161]"
    assert flightrec.kind_of("all_reduce", [[]]) == "all_reduce []"


FLIGHT_CHILD = r"""
import json, os, socket, sys
import torch, torch.distributed as dist
from trainguard.probe import flightrec
run_dir = sys.argv[1]
assert flightrec.snapshot() is None  # no process group yet
with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
for _ in range(3):
    model(torch.randn(2, 4)).sum().backward()
t = torch.ones(2)
dist.all_reduce(t, group=dist.new_group([0]))
before = flightrec.asked(run_dir)
os.makedirs(os.path.join(run_dir, "stacks"), exist_ok=True)
open(os.path.join(run_dir, "stacks", "collectives.request"), "w").close()
when = flightrec.asked(run_dir)
print(json.dumps({"before": before, "when": when, "again": flightrec.asked(run_dir), "answer": flightrec.answer(when)}))
dist.destroy_process_group()
"""


def test_probe_reads_ddps_all_reduces_from_the_flight_recorder_once_per_request(tmp_path) -> None:
    proc = subprocess.run([sys.executable, "-c", FLIGHT_CHILD, str(tmp_path)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["before"] is None and got["when"] and got["again"] is None  # answered once per request
    answer = got["answer"]
    assert answer["request"] == got["when"] and not answer.get("unavailable")
    default = answer["groups"]["default"]
    # DDP's three gradient all-reduces, done; the recorder marks an entry completed from its own thread, so
    # under load the latest may still read in flight when the snapshot is taken (8 enqueued, 7 completed)
    assert default["enqueued"] - 1 <= default["completed"] <= default["enqueued"] and default["completed"] >= 3
    assert answer["kinds"]["default"]["all_reduce [5]"] == 3  # the bucket: weight 4 + bias 1
    assert answer["active"] == []
    other = [g for g in answer["groups"] if g != "default"]
    assert other and answer["kinds"][other[0]] == {"all_reduce [2]": 1} and answer["members"][other[0]] == [0]


def test_a_recorded_collective_counts_only_when_the_ranks_stack_is_at_the_line_that_issued_it() -> None:
    # rank 0's stack is at train.py:70 (say, inside new_group()) with the all-reduce of train.py:63 still
    # recorded as in flight: it is not known to wait in that one, so nothing is proven
    lines = {0: {"train.py:70"}, 1: {"train.py:57"}}
    v = judge_flight(EXTRA, {0: "python", 1: "backward"}, lines)
    assert v["unrecoverable"] is None and v["blame"] == 0  # in no recorded collective: the one to look at
    lines[0] = {"train.py:63"}
    assert judge_flight(EXTRA, {0: "python", 1: "backward"}, lines)["unrecoverable"]


def test_without_the_flight_recorder_a_rank_inside_backward_is_not_blamed_as_never_arrived() -> None:
    # the reviewer's case with TORCH_FR_BUFFER_SIZE=0: rank 1 is inside loss.backward() (DDP's all-reduce,
    # unseen), rank 0 in an all-reduce rank 1 never called: nobody is blamed on a guess, and nothing is proof
    v = judge({0: _at("all_reduce", 1, all_reduce=1)}, {0: "all_reduce", 1: None}, in_backward={1})
    assert v["blame"] is None and v["unrecoverable"] is None
    assert v["sentence"].startswith("rank 1 is inside backward, where DDP's gradient all-reduce is not seen")
    assert v["sentence"].endswith("while rank 0 waits in all_reduce #1")


# -- NCCL: the host runs on, the device waits (probe/flightrec.py marks the entries the device runs) --


def _dev(group: str, seq: int, t: float, where: str | None = None, sizes: list | None = None) -> dict:
    origin = "python" if where else "other"  # DDP's buckets on a GPU come from autograd's thread: no stack
    return {"group": group, "seq": seq, "op": "all_reduce", "sizes": sizes or [[161]], "from": origin,
            "where": where, "t": t, "device": True, "state": "scheduled"}


# torchrun_ddp_extra_collective over NCCL: rank 0's metrics all-reduce (group "1", #1) returned at once and
# its host ran on, queuing steps 13-16's gradient all-reduces behind it, then waited in `.item()`; rank 1
# never called it, ran on to the end and waits in guard.finish() for its device, stuck in step 13's bucket
NCCL_EXTRA = {
    0: _fr({"default": (22, 18), "1": (1, 0)},
           [_dev("default", 22, 104.0), _dev("default", 21, 103.0), _dev("default", 20, 102.0),
            _dev("default", 19, 101.0), _dev("1", 1, 100.0, "train.py:63 (<module>)", sizes=[[]])],
           {"default": {"all_reduce [161]": 22}, "1": {"all_reduce []": 1}}),
    1: _fr({"default": (22, 18)}, [_dev("default", 22, 103.5), _dev("default", 19, 100.5)],
           {"default": {"all_reduce [161]": 22}}, {"default": [0, 1], "1": [0, 1]}),
}


def test_nccl_a_rank_whose_device_is_stuck_in_an_extra_collective_is_blamed_with_proof() -> None:
    v = judge_flight(NCCL_EXTRA, {0: "device", 1: "device"})
    assert v["blame"] == 0 and v["unrecoverable"]
    assert v["sentence"] == (
        "rank 0 waits in all_reduce #1 of group 1 at train.py:63 (<module>) on the device, which rank 1 never "
        "called; rank 1 waits in all_reduce #19 on the device, issued from C++ (DDP's gradient all-reduce, or the "
        "like), which rank 0 has not reached")
    assert v["waits"][0]["where"] == "train.py:63 (<module>)"  # refine puts the collective's line in `where`


def test_nccl_a_collective_queued_behind_the_devices_own_wait_is_not_reached() -> None:
    # rank 0 has enqueued #19 (its host ran ahead) but its device sits in group 1's #1 before it: without
    # that, rank 1's wait would look reachable and nothing would be proven
    v = judge_flight(NCCL_EXTRA, {0: "device", 1: "device"})
    assert "which rank 0 has not reached" in v["sentence"]


def test_nccl_a_host_still_computing_is_no_proof_and_is_the_one_to_look_at() -> None:
    # the healthy twin over NCCL: rank 1's host is inside a slow backward (nothing issued yet), rank 0's device
    # waits in the gradient all-reduce it will join
    fr = {0: _fr({"default": (19, 18)}, [_dev("default", 19, 100.0)], {"default": {"all_reduce [161]": 19}}),
          1: _fr({"default": (18, 18)}, [], {"default": {"all_reduce [161]": 18}})}
    v = judge_flight(fr, {0: "device", 1: "backward"})
    assert v["unrecoverable"] is None and v["blame"] == 1 and v["straggling"] == [1]


def test_nccl_devices_stuck_in_the_same_collective_name_nobody() -> None:
    # both devices in all-reduce #19, both hosts waiting: something outside the job (a peer's link) holds it
    fr = {r: _fr({"default": (19, 18)}, [_dev("default", 19, 100.0 + r)], {}) for r in (0, 1)}
    v = judge_flight(fr, {0: "device", 1: "device"})
    assert v["unrecoverable"] is None and v["blame"] is None


def test_nccl_device_waits_make_a_collective_cause_out_of_a_device_sync() -> None:
    from trainguard.watchdog import classify
    from trainguard.watchdog.collectives import flight_waits, where_now
    from trainguard.watchdog.stacks import Frame, ProcSample, Snapshot, ThreadStack

    def proc(pid: int, rank: int, frames: list[Frame]) -> ProcSample:
        return ProcSample(pid=pid, rank=str(rank), threads=[ThreadStack("1", "MainThread", True, frames)],
                          cpu_percent=0.0, status="sleeping")

    item = [Frame("/tmp/z/train.py", 70, "<module>", 'print(f"step {step} loss {loss.item():.4f}")')]
    finish = [Frame("/tmp/z/train.py", 75, "<module>", "guard.finish()"),
              Frame("/x/src/trainguard/probe/core.py", 239, "finish", "self.drainer.drain(final=True)"),
              Frame("/x/src/trainguard/probe/drain.py", 145, "_drain_locked", None),
              Frame("/x/src/trainguard/probe/drain.py", 215, "_wait_for_device_copies", "time.sleep(pause)")]
    snap = Snapshot(root_pid=1, samples=[{10: proc(10, 0, item), 11: proc(11, 1, finish)}], interval=2.0, taken_at=0.0,
                    gpu={"gpus": [{"index": 0}]})
    assert where_now(snap.samples[0][10].main_thread) == "device" == where_now(snap.samples[0][11].main_thread)
    waits = flight_waits(snap, NCCL_EXTRA)
    assert waits[0].startswith("all_reduce #1 of group 1") and waits[1].startswith("all_reduce #19")
    diag = classify.diagnose(snap, waits)
    assert diag.cause == "collective"
    assert classify.diagnose(snap, {}).cause == "device-sync"  # without the recorders: the host's wait alone


def test_the_probe_keeps_each_groups_oldest_collective_in_flight_however_many_are_queued_behind() -> None:
    def entry(group: str, seq: int, t: int) -> dict:
        return {"process_group": (group, ""), "collective_seq_id": seq, "time_created_ns": t,
                "profiling_name": "nccl:all_reduce", "input_sizes": [[4]], "frames": []}

    world = "0"
    queued = [(entry("0", s, 1000 + s), True) for s in range(19, 40)] + [(entry("1", 1, 500), True)]
    kept = flightrec._kept(queued, world)
    seqs = [(flightrec._group(e, world), e["collective_seq_id"]) for e, _ in kept]
    assert len(kept) == flightrec.MAX_ACTIVE
    assert ("1", 1) in seqs and ("default", 19) in seqs and ("default", 39) == seqs[0]  # newest first
    assert flightrec._entry(kept[0][0], True, world)["device"] is True


def test_the_probe_reads_both_recorders_and_keeps_the_further_position_of_a_group_in_both() -> None:
    import json
    import pickle

    def dumps(status: dict, entries: list) -> tuple:
        def dump(**kw: bool) -> bytes:
            return pickle.dumps({"pg_status": status, "entries": entries})

        def dump_json(**kw: bool) -> str:
            return json.dumps({"entries": entries})
        return dump, dump_json

    groups: dict = {}
    entries: list = []
    kinds: dict = {}
    e = {"process_group": ("0", ""), "collective_seq_id": 7, "profiling_name": "nccl:all_reduce",
         "input_sizes": [[4]], "time_created_ns": 5}
    flightrec._read(*dumps({"0": {"last_enqueued_collective": 7, "last_completed_collective": 6}}, [e]), True, "0",
                    groups, entries, kinds)
    flightrec._read(*dumps({"0": {"last_enqueued_collective": 3, "last_completed_collective": 3}}, []), False, "0",
                    groups, entries, kinds)
    assert groups == {"default": {"enqueued": 7, "completed": 6}}
    assert kinds == {"default": {"all_reduce [4]": 1}} and entries == [(e, True)]


def test_the_last_drain_answers_the_watchdog_while_it_waits_for_a_device_that_never_finishes(tmp_path) -> None:
    # under NCCL a hung collective shows in guard.finish(): the background thread has stopped, so the wait
    # itself must answer the flight-recorder request (and commit it), and give up on a sticky device error
    from types import SimpleNamespace

    from trainguard.probe.drain import Drain

    class Copy:
        def __init__(self, polls: int, broken: bool = False) -> None:
            self.polls, self.broken = polls, broken

        def ready(self) -> bool:
            if self.broken:
                raise RuntimeError("CUDA error: device-side assert triggered")
            self.polls -= 1
            return self.polls < 0

    answered: list[bool] = []
    flight = SimpleNamespace(answer=lambda commit=False: answered.append(commit), thread=None)
    rec = SimpleNamespace(flight=flight)
    assert Drain._wait_for_device_copies(rec, [Copy(3), Copy(0)]) is True  # type: ignore[arg-type]
    assert answered == [True] * 3
    assert Drain._wait_for_device_copies(rec, [Copy(0, broken=True)]) is False  # type: ignore[arg-type]


def test_nccl_a_rank_blocked_setting_up_a_groups_communicator_waits_where_its_counter_says() -> None:
    # no device_id bound: rank 0's first all-reduce on the metrics group waits inside the communicator's
    # set-up for rank 1, before NCCL records it; its counter has it (group "1", #1, inside)
    fr = {0: _fr({"default": (18, 18)}, [], {"default": {"all_reduce [161]": 18}}),
          1: NCCL_EXTRA[1]}
    positions = {0: _at("all_reduce", 1, all_reduce=1) | {"group": "1"}}
    v = judge_flight(fr, {0: "python", 1: "device"}, None, positions)
    assert v["blame"] == 0 and v["unrecoverable"]
    assert v["sentence"].startswith("rank 0 waits in all_reduce #1 of group 1, which rank 1 never called")
    assert judge_flight(fr, {0: "python", 1: "device"})["unrecoverable"] is None  # without it: no proof


def _backward_stall(ranks: list[int | None]):
    """The stacks of a new user's DDP job over NCCL hung by a `dist.barrier()` under `if rank == 0:`: every
    rank's main thread in `loss.backward()` on a futex, its probe's background thread in `torch.stack`
    behind the wedged device, no flight-recorder answer."""
    from trainguard.watchdog.stacks import Frame, ProcSample, Snapshot, ThreadStack

    main = [Frame("/w/bug.py", 152, "<module>", "main()"), Frame("/w/bug.py", 117, "main", "loss.backward()"),
            Frame("/v/site-packages/torch/_tensor.py", 631, "backward", "torch.autograd.backward("),
            Frame("/v/site-packages/torch/autograd/__init__.py", 381, "backward", "_engine_run_backward("),
            Frame("/v/site-packages/torch/autograd/graph.py", 869, "_engine_run_backward",
                  "return Variable._execution_engine.run_backward(")]
    flusher = [Frame("/usr/lib/python3.12/threading.py", 1010, "run", "self._target(*self._args, **self._kwargs)"),
               Frame("/x/src/trainguard/probe/drain.py", 103, "_loop", "self.drain()"),
               Frame("/x/src/trainguard/probe/devicestats.py", 259, "stage_step", "vec = torch.stack(tensors)")]

    def proc(pid: int, rank: int | None) -> ProcSample:
        return ProcSample(pid=pid, rank=None if rank is None else str(rank), cpu_percent=99.0, status="sleeping",
                          wchan="futex_do_wait", threads=[ThreadStack("2", "trainguard-probe", False, flusher),
                                                          ThreadStack("1", "MainThread", True, main)])

    sample = {880 + i: proc(880 + i, r) for i, r in enumerate(ranks)}
    return Snapshot(root_pid=1, samples=[sample, sample], interval=2.0, taken_at=0.0, gpu={"gpus": [{"index": 0}]})


def test_ranks_held_in_backward_without_an_answer_wait_in_a_collective_not_in_a_deadlock() -> None:
    from trainguard.watchdog import classify
    from trainguard.watchdog.collectives import UNSEEN_BACKWARD, flight_waits

    snap = _backward_stall([0, 1])
    waits = flight_waits(snap, {})
    assert waits == {0: UNSEEN_BACKWARD, 1: UNSEEN_BACKWARD}
    diag = classify.diagnose(snap, waits)
    assert diag.cause == "collective", diag
    assert "rank 0" in diag.detail and "rank 1" in diag.detail and "/w/bug.py:117" in diag.detail
    assert diag.extra["unrecoverable"] is None  # the stack alone is never proof: nothing is stopped on it
    assert "lock" not in diag.fix.split(";")[0]
    # before: "the main thread waits on an event/condition/queue ... no other thread ... could set it"
    assert classify.diagnose(snap, {}).cause == "deadlock"


def test_one_process_held_in_backward_is_not_taken_for_a_collective() -> None:
    from trainguard.watchdog.collectives import flight_waits

    assert flight_waits(_backward_stall([None]), {}) == {}
    assert flight_waits(_backward_stall([0]), {}) == {}  # one rank of this node: nothing to compare it with


HELD_CHILD = r"""
import json, os, sys, threading, time
import torch, torch.distributed as dist
import trainguard
from trainguard.store.reader import RunReader
rank, port, run_dir = int(sys.argv[1]), sys.argv[2], sys.argv[3]


def ask_and_wait() -> tuple:  # the watchdog's request; the answer in the store (None after 10 s), seconds
    os.makedirs(os.path.join(run_dir, "stacks"), exist_ok=True)
    asked = time.time()
    open(os.path.join(run_dir, "stacks", "collectives.request"), "w").close()
    while time.time() < asked + 10:
        time.sleep(0.1)
        reader = RunReader(run_dir)
        try:
            got = reader.meta().get("flightrec.0")
        finally:
            reader.close()
        if got and got["request"] >= asked - 0.01:
            return got, round(time.time() - asked, 2)
    return None, None


dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
dist.all_reduce(torch.ones(1))  # one collective in the recorders
out = {}
if rank == 0:
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = trainguard.watch(model, opt, run_dir=run_dir)
dist.barrier()  # counted on rank 0, whose probe is installed (#1)
if rank == 0:
    for _ in range(5):
        loss = model(torch.randn(2, 4)).pow(2).mean()
        loss.backward(); opt.step(); opt.zero_grad(); g.step(loss)
    time.sleep(1.5)  # a flush or two: the process is one of two ranks, its answering thread starts
    out["threads"] = sorted(t.name for t in threading.enumerate() if t.name.startswith("trainguard"))
    wedged = threading.Event()
    g.probe.drainer.drain = lambda final=False: wedged.wait()  # the background thread's next pass never returns (a wedged GPU)
    time.sleep(1.0)
dist.barrier()  # #2, after rank 0's background thread is held: its copy of the counters never gets it
if rank == 0:
    out["answer"], out["seconds"] = ask_and_wait()
    reader = RunReader(run_dir)
    out["copy"] = reader.meta().get("collectives.0")
    reader.close()
    # the script ends: finish() stops the flusher and its last drain waits for the held one; only the
    # answering thread is left to answer
    ending = threading.Thread(target=g.finish, daemon=True)
    ending.start()
    time.sleep(1.0)
    out["answer_in_finish"] = ask_and_wait()[0] is not None
    wedged.set()
    ending.join(10)
dist.barrier()
dist.destroy_process_group()
print(json.dumps(out))
"""


def test_a_rank_answers_the_flight_recorders_request_while_its_background_thread_is_held(tmp_path) -> None:
    # Over NCCL a collective that cannot complete wedges the GPU and the probe's background thread blocks in
    # its next device call: the answer comes from a thread that never touches the device.
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    procs = [subprocess.Popen([sys.executable, "-c", HELD_CHILD, str(r), port, str(tmp_path / "run")],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [e[-2000:] for _, e in outs]
    got = json.loads(outs[0][0].strip().splitlines()[-1])
    assert "trainguard-flightrec" in got["threads"]
    answer = got["answer"]
    assert answer is not None and got["seconds"] < 3.0, got
    assert not answer.get("unavailable") and "default" in answer["groups"]
    pos = answer["position"]  # the counters, fresher than the held thread's copy (and all there is without the recorder)
    assert (pos["group"], pos["op"], pos["seq"], pos["inside"]) == ("default", "barrier", 2, False), pos
    assert got["copy"]["seq"] == 1, got["copy"]
    line = next(i for i, text in enumerate(HELD_CHILD.splitlines(), start=1) if text.startswith("dist.barrier()  # #2"))
    assert pos["where"] == f"<string>:{line} (<module>)", pos  # the line that called it (python -c: "<string>")
    assert got["answer_in_finish"]


def test_a_ranks_own_wait_inside_its_backward_is_not_taken_for_a_collective() -> None:
    # a custom autograd Function (or a hook) that waits on an Event inside backward: its own wait, which
    # classify reads as such; only a stack whose innermost frame is autograd's engine reads as a collective
    from trainguard.watchdog.collectives import flight_waits
    from trainguard.watchdog.stacks import Frame

    snap = _backward_stall([0, 1])
    for p in snap.samples[0].values():
        p.main_thread.frames += [Frame("/w/bug.py", 17, "backward", "ready.wait()"),
                                 Frame("/usr/lib/python3.12/threading.py", 655, "wait", "signaled = self._cond.wait(timeout)"),
                                 Frame("/usr/lib/python3.12/threading.py", 355, "wait", "waiter.acquire()")]
    assert flight_waits(snap, {}) == {}


def test_nccl_hosts_held_in_backward_are_read_by_what_their_devices_wait_in_named_never_proof() -> None:
    # The new user's job over NCCL, with its recorders answering: rank 0's barrier (all_reduce #501, from
    # bug.py:139) took rank 1's first bucket of step 501 as its partner; both hosts sit in the next
    # backward, launching behind devices stuck in DDP's buckets (issued from C++: no line). Before: no wait
    # was seen (nothing from a line of backward) and the two ranks read as a deadlock.
    from trainguard.watchdog import classify
    from trainguard.watchdog.collectives import flight_waits, refine

    snap = _backward_stall([0, 1])
    flight = {
        0: _fr({"default": (504, 501)}, [_dev("default", 502, 10.0), _dev("default", 503, 10.1),
                                         _dev("default", 504, 10.2)], {"default": {"all_reduce [161]": 503}}),
        1: _fr({"default": (503, 500)}, [_dev("default", 501, 10.0), _dev("default", 502, 10.1),
                                         _dev("default", 503, 10.2)], {"default": {"all_reduce [161]": 503}}),
    }
    waits = flight_waits(snap, flight)
    assert waits[0].startswith("all_reduce #502") and waits[1].startswith("all_reduce #501"), waits
    diag = classify.diagnose(snap, waits)
    assert diag.cause == "collective"
    refine(diag, snap, {}, flight)
    assert "rank 0 waits in all_reduce #502" in diag.detail and "rank 1 waits in all_reduce #501" in diag.detail
    assert not diag.extra.get("unrecoverable")  # hosts inside backward may still be launching: never proof


def test_nccl_without_the_recorder_a_call_only_one_rank_made_is_named_from_the_counters() -> None:
    # The new user's job over NCCL with TORCH_FR_BUFFER_SIZE=0: rank 0's barrier under `if rank == 0:`
    # returned at once (the device runs it) and both hosts sit inside the next backward; no answer names a
    # collective. The counters (sent with the answers, fresher than the held background thread's copy)
    # still say rank 0 made a call rank 1 never made, and where.
    from trainguard.watchdog import classify
    from trainguard.watchdog.collectives import flight_waits, refine

    snap = _backward_stall([0, 1])
    diag = classify.diagnose(snap, flight_waits(snap, {}))
    positions = {0: {"group": "default", "op": "barrier", "seq": 1, "inside": False, "where": "/w/bug.py:139",
                     "ops": {"barrier": 1}}}
    before = diag.detail
    refine(diag, snap, positions, {}, answered={0})  # rank 1 did not answer: no probe there, its calls uncounted
    assert diag.detail == before
    refine(diag, snap, positions, {}, answered={0, 1})  # both answered: rank 1's probe counted no call
    assert diag.detail.startswith("no rank waits in a collective its Python code called, but rank 0 made barrier #1 "
                                  "at /w/bug.py:139, a call rank 1 never made; inside backward, a collective the "
                                  "backward issues (DDP's gradient all-reduce, or the like) pairs with it and waits "
                                  "for a partner that never comes (the flight recorder, TORCH_FR_BUFFER_SIZE, would "
                                  "name it) (rank 0 is out of step"), diag.detail
    assert diag.extra["blamed_rank"] == 0 and diag.where == "/w/bug.py:139"
    assert diag.extra["host_waits_at"] == "/w/bug.py:117 (main)"
    assert not diag.extra.get("unrecoverable")  # never proof: nothing says what either device waits in
    # the same number of calls on every rank: nothing out of step, nothing said
    even = {r: {"group": "default", "op": "all_reduce", "seq": 4, "inside": False, "ops": {"all_reduce": 4}}
            for r in (0, 1)}
    assert judge(even, {0: None, 1: None}, in_backward={0, 1}, answered={0, 1}) is None
    # one rank ahead by a call of a kind the others make too (a metric's all-reduce): under NCCL a host runs
    # ahead of its device, so that says nothing
    behind = {**even, 2: {"group": "default", "op": "all_reduce", "seq": 3, "inside": False, "ops": {"all_reduce": 3}}}
    assert judge(behind, {0: None, 1: None, 2: None}, in_backward={0, 1, 2}, answered={0, 1, 2}) is None
    # three ranks, one that never made the barrier the two others made: the odd one out is the one named
    skipped = {r: {"group": "default", "op": "barrier", "seq": 5, "inside": False, "where": "/w/t.py:9 (<module>)",
                   "ops": {"all_reduce": 4, "barrier": 1}} for r in (0, 1)}
    skipped[2] = even[0]
    v = judge(skipped, {0: None, 1: None, 2: None}, in_backward={0, 1, 2}, answered={0, 1, 2})
    assert v["blame"] == 2 and v["where"] is None, v
    assert "ranks 0, 1 made barrier #5 at /w/t.py:9 (<module>), a call rank 2 never made" in v["sentence"]


def test_the_counters_a_rank_sent_with_its_answer_replace_its_background_threads_older_copy(tmp_path) -> None:
    from trainguard.store.writer import StoreWriter
    from trainguard.watchdog.collectives import answered, read_positions

    w = StoreWriter(tmp_path, rank=0)
    w.set_meta("collectives.0", {"group": "default", "op": "all_reduce", "seq": 7, "inside": False})
    w.set_meta("flightrec.0", {"request": 100.0, "t": 100.2, "step": 41, "unavailable": True,
                               "position": {"group": "default", "op": "barrier", "seq": 8, "inside": False}})
    w.close()
    assert read_positions(tmp_path)[0]["seq"] == 7  # no request: the copy
    assert read_positions(tmp_path, asked=100.0)[0]["op"] == "barrier"  # answered with the recorder off
    assert answered(tmp_path, 100.0) == {0}
    assert read_positions(tmp_path, asked=200.0)[0]["seq"] == 7  # an answer to an older request: not this stall's
    assert answered(tmp_path, 200.0) == set()
    # an answer without counters (no call made in this attempt): the copy, an earlier attempt's, is dropped
    w = StoreWriter(tmp_path, rank=0)
    w.set_meta("flightrec.0", {"request": 300.0, "t": 300.1, "step": 3, "unavailable": True, "position": None})
    w.close()
    assert read_positions(tmp_path, asked=300.0) == {} and answered(tmp_path, 300.0) == {0}
