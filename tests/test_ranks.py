"""The cross-rank rules (rules/ranks.py) on streams of two or four ranks, as the store interleaves them.

Each rule is tried on the failure it names and on a healthy stream that must stay quiet. The zoo runs
them on real torchrun jobs (scenarios/torchrun_ddp_*); these are the edges: one-offs, noise, a rank
that is late, everything at once.

    pytest tests/test_ranks.py
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from trainguard.rules.engine import run_rules
from trainguard.store.ranks import launched_alone

DDP = {"total_steps": 200, "world_size": 2, "model": "DistributedDataParallel"}


def _rows(n: int, ranks: int = 2, change: Any = None, seed: int = 0) -> list[dict[str, Any]]:
    """n steps of `ranks` data-parallel ranks: equal grad norms, a few ms of jitter in the time before the
    all-reduce, rows written a little apart; `change(step, rank, row)` plants a fault."""
    rng = random.Random(seed)
    out = []
    for s in range(1, n + 1):
        grad = 1.0 + 0.1 * rng.random()  # one value for every rank: DDP averaged it
        for r in range(ranks):
            row = {"kind": "step", "step": s, "rank": r, "t": 0.05 * s + 0.001 * r, "loss": 2.0 - s / n,
                   "grad_norm": grad if s <= 10 or s % 10 == 0 else None, "step_time": 0.05,
                   "extra": {"presync_s": 0.010 + rng.uniform(0, 0.004)}}
            if change is not None:
                change(s, r, row)
            out.append(row)
    return out


def _names(found: list) -> list[str]:
    return [f.name for f in found if f.code.startswith("TG70")]


def test_a_healthy_four_rank_run_is_quiet() -> None:
    assert _names(run_rules(_rows(200, ranks=4), {**DDP, "world_size": 4})) == []


def test_the_rank_whose_loss_went_nan_first_is_named_not_the_ones_it_spread_to() -> None:
    def nan_on_rank_2(s: int, r: int, row: dict) -> None:
        if (s == 50 and r == 2) or s > 50:
            row["loss"] = float("nan")
        if s >= 50:
            row["grad_norm"] = float("nan")  # the all-reduce gives every rank the NaN gradient
    (f,) = [f for f in run_rules(_rows(80, ranks=4, change=nan_on_rank_2), {**DDP, "world_size": 4})
            if f.name == "nonfinite-on-one-rank"]
    assert f.step == 50 and f.evidence["origin_ranks"] == [2] and f.evidence["finite_ranks"] == [0, 1, 3]
    assert f.summary.startswith("rank 2's loss is nan at step 50")
    # every rank at once (a learning rate too high for all): not one rank's problem, the per-rank rules say it
    def nan_everywhere(s: int, r: int, row: dict) -> None:
        if s >= 50:
            row["loss"] = float("nan")
    assert "nonfinite-on-one-rank" not in _names(run_rules(_rows(80, change=nan_everywhere), DDP))


def test_a_straggler_is_named_and_a_one_off_or_noise_is_not() -> None:
    def slow_rank_1(s: int, r: int, row: dict) -> None:
        if r == 1 and s >= 60:
            row["extra"]["presync_s"] += 0.030  # reads its shard from a slower disk
    (f,) = [f for f in run_rules(_rows(240, change=slow_rank_1), DDP) if f.name == "straggler-rank"]
    # judged over 5 s of 50 ms steps: found once rank 1 has been slow for 80 of the last 100
    assert f.evidence["rank"] == 1 and 60 <= f.step and f.evidence["detected_step"] <= 60 + 85
    assert f.evidence["wait_ms"] > 25

    def load_bursts(s: int, r: int, row: dict) -> None:
        if (s // 20) % 2 == r:
            row["extra"]["presync_s"] += 0.008  # another job on a shared host takes this rank's core for 20 steps
    assert _names(run_rules(_rows(400, change=load_bursts), DDP)) == []

    def checkpoint_on_rank_0(s: int, r: int, row: dict) -> None:
        if r == 0 and s % 25 == 0:
            row["extra"]["presync_s"] += 2.0  # rank 0 saves a checkpoint: a one-off, every 25 steps
    assert _names(run_rules(_rows(200, change=checkpoint_on_rank_0), DDP)) == []

    def small_skew(s: int, r: int, row: dict) -> None:
        if r == 1:
            row["extra"]["presync_s"] += 0.004  # always a little slower: 8% of a 50 ms step is not worth a warning
    assert _names(run_rules(_rows(200, change=small_skew), DDP)) == []


def test_ddp_grad_norms_that_differ_are_a_desync_and_other_wrappers_are_not_compared() -> None:
    def clipped_on_rank_0(s: int, r: int, row: dict) -> None:
        if r == 0 and row["grad_norm"] is not None:
            row["grad_norm"] = 0.5
    (f,) = [f for f in run_rules(_rows(60, change=clipped_on_rank_0), DDP) if f.name == "grad-norms-differ"]
    assert f.step == 1 and f.evidence["steps"] == [1, 2, 3]
    # FSDP holds a different shard on each rank: its norms differ by design
    assert _names(run_rules(_rows(60, change=clipped_on_rank_0), {**DDP, "model": "FullyShardedDataParallel"})) == []

    def one_step_apart(s: int, r: int, row: dict) -> None:
        if r == 0 and s == 5:
            row["grad_norm"] = 0.5  # a single sampled step: not sustained
    assert _names(run_rules(_rows(60, change=one_step_apart), DDP)) == []


def test_a_rank_that_stops_while_the_others_go_on_is_found() -> None:
    rows = [r for r in _rows(400, ranks=3) if not (r["rank"] == 1 and r["step"] > 100)]
    (f,) = [f for f in run_rules(rows, {**DDP, "world_size": 3, "total_steps": 400}) if f.name == "rank-stopped"]
    assert f.evidence["rank"] == 1 and f.step == 100 and f.evidence["seconds_behind"] >= 5
    # a rank that is a step behind the others while they write (the store interleaves them) is not stopped
    late = [dict(r, t=r["t"] + (0.06 if r["rank"] == 1 else 0)) for r in _rows(400)]
    assert _names(run_rules(late, DDP)) == []


def test_a_rank_waiting_at_a_barrier_while_rank_0_evaluates_has_not_stopped() -> None:
    """The usual DDP evaluation: at step 100 rank 0 evaluates alone for 13 s while rank 1 waits at a barrier;
    then both go on in step. Rank 1's rows after the barrier reach the store a few steps later than rank 0's
    (its own flush): rank 0's first steps after its evaluation are no sign that rank 1 stopped."""
    def evaluation(s: int, r: int, row: dict) -> None:
        if s > 100:
            row["t"] += 13.0
    rows = _rows(400, change=evaluation)
    # the store's order: rank 1's rows of steps 100-105 come after rank 0's of steps 100-108
    held = [r for r in rows if r["rank"] == 1 and 100 <= r["step"] <= 105]
    order = [r for r in rows if r not in held]
    at = next(i for i, r in enumerate(order) if r["rank"] == 0 and r["step"] == 108) + 1
    order[at:at] = held
    assert _names(run_rules(order, DDP)) == []
    # ... while a rank 1 that never comes back is found, a few steps and 2 s into rank 0's going on
    gone = [r for r in rows if not (r["rank"] == 1 and r["step"] >= 100)]
    (f,) = [f for f in run_rules(gone, DDP) if f.name == "rank-stopped"]
    assert f.evidence["rank"] == 1 and f.step == 99


def _crash(rank: int, t: float, exception: str, message: str) -> dict[str, Any]:
    return {"kind": "crash", "rank": rank, "pid": 100 + rank, "t": t, "step": 14, "name": exception,
            "data": {"exception": exception, "message": message, "frames": []}}


LOST = ("[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:5016. "
        "This is typically caused by a remote worker crashing.")


def test_the_first_rank_to_fail_is_the_cause_and_the_others_say_they_are_consequences() -> None:
    from trainguard.rules.crash import first_crash

    f = first_crash([_crash(0, 108.0, "RuntimeError", LOST), _crash(1, 100.0, "IndexError", "Target 7 is out of bounds.")])
    assert f is not None and f.exception == "IndexError" and f.evidence["rank"] == 1
    assert f.summary.startswith("rank 1 failed first: IndexError")
    (later,) = f.evidence["consequences"]
    assert later.startswith("rank 0 (pid 100), +8.0 s later: RuntimeError") and "it lost rank 1, which had failed" in later


def test_a_rank_that_vanished_without_an_error_is_the_cause_of_the_others_lost_connections() -> None:
    from trainguard.rules.crash import first_crash

    # rank 1 was killed (the OOM killer): it recorded nothing; rank 0 only says its peer went away
    f = first_crash([_crash(0, 108.0, "RuntimeError", LOST)], silent_ranks=[1])
    assert f is not None and f.cause == "rank-vanished" and f.evidence["silent_ranks"] == [1]
    assert f.summary.startswith("rank 1 ended without a Python error") and "rank 0's error is a consequence" in f.summary
    # a real error on a rank is never blamed on a silent one (torchrun stops the others with a signal)
    f = first_crash([_crash(0, 100.0, "ValueError", "bad shard")], silent_ranks=[1])
    assert f is not None and f.cause != "rank-vanished" and f.exception == "ValueError"
    # gloo's side of a peer that aborted (a collective mismatch: SIGABRT in C++, no Python error) reads
    # "Read error ...: Connection reset by peer": a lost peer too
    reset = ("[../gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:9111: Connection reset by peer. This is "
             "typically caused by a remote worker hanging or bugs in the application.")
    f = first_crash([_crash(1, 100.0, "RuntimeError", reset)], silent_ranks=[0])
    assert f is not None and f.cause == "rank-vanished" and f.summary.startswith("rank 0 ended without a Python error")


def test_a_rank_that_aborted_in_cpp_is_named_with_the_runtimes_last_words() -> None:
    """gloo aborts a rank whose collective does not match (SIGABRT, no Python error); what it said is in
    the output, and the finding quotes it instead of guessing a kill or a segfault."""
    from trainguard.rules.crash import first_crash, native_abort

    output = ["step 15 | loss 0.2272", "terminate called after throwing an instance of 'gloo::EnforceNotMet'",
              "  what():  [enforce fail at ../gloo/transport/tcp/pair.cc:456] op.preamble.length <= op.nbytes. "
              "2180 vs 4. Received data size doesn't match expected size. Is there a distributed collective "
              "mismatch in your code?", "[rank0]: Traceback (most recent call last):"]
    abort = native_abort(output)
    assert abort is not None and abort.startswith("gloo::EnforceNotMet: op.preamble.length <= op.nbytes")
    assert native_abort(["step 1", "Traceback (most recent call last):"]) is None
    reset = ("[../gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:9111: Connection reset by peer. This is "
             "typically caused by a remote worker hanging or bugs in the application. Check the logs.")
    f = first_crash([_crash(0, 100.0, "RuntimeError", reset)], silent_ranks=[1], abort=abort)
    assert f is not None and f.cause == "rank-vanished" and f.summary.startswith("rank 1 aborted in native code (gloo")
    assert "collective" in f.fix and f.evidence["native_abort"] == abort
    assert "remo)" not in f.summary  # cut at a word, not inside one


def test_a_rank_done_with_its_shard_has_not_stopped() -> None:
    # uneven data under DDP's Join: rank 1 runs out of batches at step 90 and finishes its probe
    rows: list[dict[str, Any]] = [r for r in _rows(100) if not (r["rank"] == 1 and r["step"] > 90)]
    at = next(i for i, r in enumerate(rows) if r["rank"] == 1 and r["step"] == 90)
    rows.insert(at + 1, {"kind": "probe", "name": "finish", "rank": 1, "t": rows[at]["t"], "step": 90})
    assert _names(run_rules(rows, {**DDP, "total_steps": 100})) == []


def test_status_says_where_each_rank_ran_and_how_far_it_got(tmp_path: Path) -> None:
    from tgtest import run_trainguard

    from trainguard.store.ranks import rank_info
    from trainguard.store.status import write_status
    from trainguard.store.writer import StoreWriter

    for rank in range(4):  # a 2 x 2 job; rank 3 is behind
        env = {"RANK": str(rank), "LOCAL_RANK": str(rank % 2), "GROUP_RANK": str(rank // 2), "WORLD_SIZE": "4"}
        w = StoreWriter(tmp_path, rank=rank)
        w.set_rank_info(rank_info(env))
        w.pid = 1000 + rank  # one process per rank, as under torchrun
        w.set_heartbeat(t_progress=1.0, micro=10, step=7 if rank == 3 else 10, phase=None, state="running")
        w.close()
    write_status(tmp_path, {"state": "running", "step": 10})
    out = run_trainguard("status", str(tmp_path)).stdout
    assert "ranks: node 0 (" in out and ": 0 at step 10, 1 at step 10; node 1 (" in out and "3 at step 7" in out


def test_status_says_a_rank_recorded_no_step_rather_than_that_it_made_none(tmp_path: Path) -> None:
    """Rank 0 aborted (gloo's SIGABRT on a collective mismatch) before its writer flushed: it trained, but
    nothing of it is in the store. Rank 2's rows are there without a heartbeat: its last row says how far."""
    from tgtest import run_trainguard

    from trainguard.store.ranks import rank_info
    from trainguard.store.status import write_status
    from trainguard.store.writer import StoreWriter

    for rank in range(3):
        w = StoreWriter(tmp_path, rank=rank)
        w.set_rank_info(rank_info({"RANK": str(rank), "WORLD_SIZE": "3"}))
        if rank == 1:
            w.set_heartbeat(t_progress=1.0, micro=13, step=13, phase=None, state="running")
        if rank == 2:
            for step in range(1, 12):
                w.add_step({"step": step, "t": float(step), "loss": 1.0})
        w.close()
    write_status(tmp_path, {"state": "crashed", "step": 13, "exit_code": 1})
    out = run_trainguard("status", str(tmp_path)).stdout
    assert ": 0 (no step recorded), 1 at step 13, 2 at step 11" in out, out


def test_the_probe_measures_a_ranks_time_before_its_backward(tmp_path: Path, monkeypatch: Any) -> None:
    import time

    import torch

    import trainguard
    from trainguard.store.reader import RunReader

    # rank 1 of 2 (torchrun's environment); the measure needs no process group, only the two hooks
    for k, v in {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "GROUP_RANK": "0"}.items():
        monkeypatch.setenv(k, v)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    guard = trainguard.watch(model, opt, total_steps=6, run_dir=tmp_path)
    try:
        for step in range(1, 7):
            time.sleep(0.05 if step >= 4 else 0.0)  # slower data from step 4 on
            loss = model(torch.randn(4, 8)).pow(2).mean()
            with torch.no_grad():  # an evaluation forward: not a mark
                model.eval()
                model(torch.randn(2, 8))
                model.train()
            opt.zero_grad()
            loss.backward()
            opt.step()
            guard.step(loss)
    finally:
        guard.finish()
    rows = {r["step"]: r for r in RunReader(tmp_path).steps()}
    assert all(r["rank"] == 1 for r in rows.values())
    pre = {s: r["extra"].get("presync_s") for s, r in rows.items()}
    assert pre[1] is None  # no synchronisation before the first step
    assert all(pre[s] is not None and pre[s] < 0.04 for s in (2, 3)), pre
    assert all(pre[s] is not None and pre[s] >= 0.05 for s in (4, 5, 6)), pre


def test_a_stored_run_is_read_rank_by_rank_in_time_order(tmp_path: Path) -> None:
    from trainguard.rules.diagnose import diagnose_run
    from trainguard.store.ranks import rank_info
    from trainguard.store.writer import StoreWriter

    # each rank commits its rows in one block (rank 0's 60 steps, then rank 1's), as two probes' flushes do;
    # rank 1's loss is NaN from step 12, rank 0's from 13 (what the all-reduce spread)
    rows = _rows(60, change=lambda s, r, row: row.update(loss=float("nan")) if s >= 12 + (r == 0) else None)
    for rank in (0, 1):
        w = StoreWriter(tmp_path, rank=rank)
        w.set_rank_info(rank_info({"RANK": str(rank), "WORLD_SIZE": "2"}))
        if rank == 0:
            w.set_meta("plan", DDP)
        for row in rows:
            if row["rank"] == rank:
                w.add_step({**row, "t": 1000.0 + row["t"]})
        w.close()
    found = {f.name: f for f in diagnose_run(tmp_path) if f.severity != "info"}
    assert found["nonfinite-on-one-rank"].evidence["origin_ranks"] == [1]
    assert found["nonfinite-loss"].step == 12 and found["nonfinite-loss"].evidence["rank"] == 1


def test_ranks_rows_arriving_in_flush_batches_are_still_compared() -> None:
    # each rank's probe flushes its rows in batches: in a short run the store holds rank 0's whole run
    # before rank 1's first row, and the steps must wait for rank 1 rather than be judged alone
    def unwrapped_forward(s: int, r: int, row: dict) -> None:
        if row["grad_norm"] is not None:
            row["grad_norm"] *= 1.0 + 0.05 * r  # no all-reduce: each rank keeps its own gradients
    rows = _rows(40, change=unwrapped_forward)
    by_rank = sorted(rows, key=lambda row: row["rank"])  # rank 0's 40 rows, then rank 1's
    (f,) = [f for f in run_rules(by_rank, {**DDP, "total_steps": 40}) if f.name == "grad-norms-differ"]
    assert f.step == 1 and f.evidence["steps"] == [1, 2, 3]
    assert _names(run_rules(sorted(_rows(40), key=lambda row: row["rank"]), {**DDP, "total_steps": 40})) == []


def test_a_device_side_assert_is_the_ranks_own_fault_even_when_nccls_watchdog_reports_it() -> None:
    """Over NCCL a label out of range is a device-side assert: rank 1 raises it (or NCCL's watchdog aborts
    rank 1 with it, SIGABRT, no Python error); rank 0 only lost its peer. Rank 1 and the assert are named."""
    from trainguard.rules.crash import classify_crash, first_crash, is_consequence
    from trainguard.rules.firstfailure import first_failure_finding

    watchdog = ("[PG ID 0 PG GUID 0(default_pg) Rank 1] Process group watchdog thread terminated with exception: "
                "CUDA error: device-side assert triggered")
    assert classify_crash("DistBackendError", watchdog)[0] == "cuda-device-assert"
    assert not is_consequence(f"DistBackendError: {watchdog}") and is_consequence("DistBackendError: NCCL timeout")
    f = first_crash([_crash(1, 100.0, "AcceleratorError", "CUDA error: device-side assert triggered"),
                     _crash(0, 100.5, "DistBackendError", watchdog.replace("Rank 1", "Rank 0")
                            .replace("CUDA error: device-side assert triggered", "NCCL communicator was aborted"))])
    assert f is not None and f.cause == "cuda-device-assert" and f.evidence["rank"] == 1
    lost = ("[../gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:9111: Connection reset by peer.")
    abort = f"c10::DistBackendError: {watchdog}"
    f = first_crash([_crash(0, 100.0, "RuntimeError", lost)], silent_ranks=[1], abort=abort)
    assert f is not None and f.cause == "cuda-device-assert" and f.evidence["rank"] == 1
    # no probe: torchrun's summary names rank 1 (exit -6) without a traceback; the runtime's last words say why
    output = ["/pytorch/aten/src/ATen/native/cuda/Loss.cu:245: nll_loss_forward_reduce_cuda_kernel_2d: block: "
              "[0,0,0], thread: [3,0,0] Assertion `t >= 0 && t < n_classes` failed.",
              "terminate called after throwing an instance of 'c10::DistBackendError'", f"  what():  {watchdog}",
              "Root Cause (first observed failure):", "[0]:", "  time      : 2026-01-01_00:00:00",
              "  host      : h", "  rank      : 1 (local_rank: 1)", "  exitcode  : -6 (pid: 42)",
              "  error_file: <N/A>", "  traceback : Signal 6 (SIGABRT) received by PID 42", "=" * 20]
    f = first_failure_finding(output, step=12, elapsed=3.0)
    assert f is not None and f.cause == "cuda-device-assert" and f.evidence["rank"] == 1
    assert f.evidence["native_abort"].startswith("c10::DistBackendError: [PG ID 0")


def test_other_cuda_errors_are_not_device_side_asserts() -> None:
    """Every CUDA error torch raises ends with the same hint about device-side assertions: an out-of-memory,
    a missing kernel image or an illegal access is not named an assert (nor given its label-out-of-range fix),
    and an out-of-memory reported with a lost peer's message stays a consequence."""
    from trainguard.rules.crash import classify_crash, is_consequence

    hint = ("\nCUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below "
            "might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1\nCompile with "
            "`TORCH_USE_CUDA_DSA` to enable device-side assertions.\n")
    assert classify_crash("AcceleratorError", "CUDA error: device-side assert triggered" + hint)[0] == "cuda-device-assert"
    for message in ("CUDA error: out of memory", "CUDA error: no kernel image is available for execution on the device",
                    "CUDA error: an illegal memory access was encountered", "CUDA error: invalid resource handle"):
        assert classify_crash("AcceleratorError", message + hint)[0] != "cuda-device-assert", message
    assert is_consequence("DistBackendError: NCCL communicator was aborted; CUDA error: out of memory" + hint)


def test_on_a_gpu_the_devices_time_before_the_all_reduce_names_the_straggler_the_hosts_hide() -> None:
    # over NCCL rank 0's host waits for rank 1 in the `loss.item()` after its step, so both hosts' times
    # before the all-reduce read ~40 ms; the devices' say who sat idle for its host (rank 1: slow data)
    def nccl(s: int, r: int, row: dict) -> None:
        row["extra"]["presync_s"] += 0.030
        row["extra"]["presync_device_s"] = 0.002 + (0.030 if r == 1 else 0.0) + 0.0001 * (s % 3)
    (f,) = [f for f in run_rules(_rows(240, change=nccl), DDP) if f.name == "straggler-rank"]
    assert f.evidence["rank"] == 1 and f.evidence["wait_ms"] > 25
    # the device's times only where every rank has them: a rank without falls back to the hosts' (no finding)
    def one_rank_only(s: int, r: int, row: dict) -> None:
        nccl(s, r, row)
        if r == 0:
            del row["extra"]["presync_device_s"]
    assert "straggler-rank" not in _names(run_rules(_rows(240, change=one_rank_only), DDP))


def test_a_rank_whose_rows_end_early_but_whose_answers_say_it_went_on_has_not_stopped() -> None:
    # The new user's hung NCCL job: rank 1's background thread blocked behind the wedged GPU, its rows end
    # at step 459 while it ran to 500; its flight-recorder answer (given from a thread of its own) says so.
    from trainguard.rules.ranks import STEPS_REACHED

    rows = [r for r in _rows(500) if not (r["rank"] == 1 and r["step"] > 459) and r["step"] <= 498]
    plan = {**DDP, "total_steps": 500}
    (f,) = [f for f in run_rules(rows, plan) if f.name == "rank-stopped"]  # the rows alone: it stopped
    assert f.summary == "rank 1 stopped at step 459 while rank 0 went on to step 498"
    heard = {"kind": STEPS_REACHED, "t": None, "data": {"0": 500, "1": 500}}
    assert _names(run_rules(rows + [heard], plan)) == []
    # a rank that truly stopped answers from where it stopped: still named, from where it got to
    stuck = {"kind": STEPS_REACHED, "t": None, "data": {"1": 461}}
    (f,) = [f for f in run_rules(rows + [stuck], plan) if f.name == "rank-stopped"]
    assert f.summary == "rank 1 stopped at step 461 while rank 0 went on to step 498"


HELD_RANK = r'''
"""Two ranks over gloo; rank 1's probe background thread is held from step 20 on (as behind a GPU a NCCL
collective wedged: its rows stop reaching the store while it trains on), and rank 0 then waits in a barrier
rank 1 never calls (the new user's bug)."""
import threading, time
import torch, torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
import trainguard

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
torch.set_num_threads(1)
model = DDP(nn.Linear(16, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
guard = trainguard.watch(model, opt, total_steps=200)
for step in range(1, 201):
    loss = model(torch.randn(8, 16)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step(); guard.step(loss)
    if step == 20 and rank == 1:
        time.sleep(1.5)  # a flush or two first: its rows of steps 1-20 are in the store
        held = threading.Event()
        guard.probe.drainer.drain = lambda final=False: held.wait()
    if step == 60 and rank == 0:
        dist.barrier()
guard.finish()
'''


def test_a_hung_job_whose_rank_wrote_no_rows_for_its_last_steps_names_the_hang_not_a_stopped_rank(tmp_path: Path) -> None:
    import sys

    from tgtest import run_trainguard

    from trainguard.store.reader import RunReader

    script = tmp_path / "train.py"
    script.write_text(HELD_RANK)
    run = tmp_path / "run"
    proc = run_trainguard("run", "--run-dir", str(run), "--stall-timeout", "5", "--", sys.executable, "-m",
                          "torch.distributed.run", "--nproc_per_node=2", str(script), cwd=tmp_path, timeout=150)
    assert proc.returncode == 124, proc.stdout[-3000:] + proc.stderr[-3000:]
    with RunReader(run) as reader:
        assert 10 <= (reader.last_step_of(1) or 0) < 40 <= (reader.last_step_of(0) or 0)  # rank 1's rows did stop
        reached = reader.steps_reached()
    assert reached[1] >= 60, reached  # its answer said how far it got
    assert "run-hung" in proc.stderr and "rank-stopped" not in proc.stderr, proc.stderr[-3000:]
    again = run_trainguard("diagnose", str(run))
    assert "rank-stopped" not in again.stdout + again.stderr, again.stdout[-3000:]


def test_how_far_each_rank_got_counts_this_attempts_heartbeats_and_answers_only(tmp_path: Path) -> None:
    from trainguard.store.reader import RunReader
    from trainguard.store.writer import StoreWriter

    # attempt 0 ran to step 500 on both ranks; attempt 1 resumed from step 400, rank 1 hung at step 420
    for attempt, steps in ((0, {0: 500, 1: 500}), (1, {0: 460, 1: 420})):
        for rank, step in steps.items():
            w = StoreWriter(tmp_path, rank=rank, attempt=attempt)
            w.pid = 1000 + 10 * attempt + rank  # one process per rank and attempt
            w.set_heartbeat(t_progress=1000.0 * (attempt + 1) + step, micro=step, step=step, phase=None,
                            state="running")
            w.set_meta(f"flightrec.{rank}", {"request": 1.0, "t": 1000.0 * (attempt + 1) + step, "step": step + 1,
                                             "attempt": attempt})
            w.close()
    with RunReader(tmp_path) as reader:
        assert reader.steps_reached() == {0: 460, 1: 420}
    # rank 1's answer of attempt 0 left in meta (its attempt-1 process never answered): not attempt 1's
    w = StoreWriter(tmp_path, rank=1, attempt=0)
    w.set_meta("flightrec.1", {"request": 1.0, "t": 1500.0, "step": 501, "attempt": 0})
    w.close()
    with RunReader(tmp_path) as reader:
        assert reader.steps_reached() == {0: 460, 1: 420}
    # an answer that ran ahead of the heartbeat (the thread that writes the heartbeat is held) counts
    w = StoreWriter(tmp_path, rank=1, attempt=1)
    w.set_meta("flightrec.1", {"request": 2.0, "t": 2600.0, "step": 461, "attempt": 1})
    w.close()
    with RunReader(tmp_path) as reader:
        assert reader.steps_reached() == {0: 460, 1: 460}


@pytest.mark.parametrize(("environ", "alone"), [
    ({}, True),
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "1"}, True),  # a one-task batch script
    ({"RANK": "0", "WORLD_SIZE": "1"}, True),  # torchrun --nproc-per-node 1
    ({"RANK": "2"}, False),  # a hand-made launch with RANK only
    ({"WORLD_SIZE": "4", "RANK": "0"}, False),
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "3"}, False),
])
def test_only_a_plain_launch_counts_as_alone(environ: dict[str, str], alone: bool) -> None:
    assert launched_alone(environ) is alone
