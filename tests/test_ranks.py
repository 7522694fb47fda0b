"""The cross-rank rules (rules/ranks.py) on streams of two or four ranks, as the store interleaves them.

Each rule is tried on the failure it names and on a healthy stream that must stay quiet. The zoo runs
them on real torchrun jobs (scenarios/torchrun_ddp_*); these are the edges: one-offs, noise, a rank
that is late, everything at once.

    pytest tests/test_ranks.py
"""

from __future__ import annotations

import random
from typing import Any

from trainguard.rules.engine import run_rules

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
    (f,) = [f for f in run_rules(_rows(120, change=slow_rank_1), DDP) if f.name == "straggler-rank"]
    assert f.evidence["rank"] == 1 and 60 <= f.step and f.evidence["detected_step"] <= 60 + 25
    assert f.evidence["wait_ms"] > 25

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


def _crash(rank: int, t: float, exception: str, message: str) -> dict[str, Any]:
    return {"kind": "crash", "rank": rank, "pid": 100 + rank, "t": t, "step": 14, "name": exception,
            "data": {"exception": exception, "message": message, "frames": []}}


LOST = ("[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:5016. "
        "This is typically caused by a remote worker crashing.")


def test_the_first_rank_to_fail_is_the_cause_and_the_others_say_they_are_consequences() -> None:
    from trainguard.watchdog.crash import first_crash

    f = first_crash([_crash(0, 108.0, "RuntimeError", LOST), _crash(1, 100.0, "IndexError", "Target 7 is out of bounds.")])
    assert f is not None and f.exception == "IndexError" and f.evidence["rank"] == 1
    assert f.summary.startswith("rank 1 failed first: IndexError")
    (later,) = f.evidence["consequences"]
    assert later.startswith("rank 0 (pid 100), +8.0 s later: RuntimeError") and "it lost rank 1, which had failed" in later


def test_a_rank_that_vanished_without_an_error_is_the_cause_of_the_others_lost_connections() -> None:
    from trainguard.watchdog.crash import first_crash

    # rank 1 was killed (the OOM killer): it recorded nothing; rank 0 only says its peer went away
    f = first_crash([_crash(0, 108.0, "RuntimeError", LOST)], silent_ranks=[1])
    assert f is not None and f.cause == "rank-vanished" and f.evidence["silent_ranks"] == [1]
    assert f.summary.startswith("rank 1 ended without a Python error") and "rank 0's error is a consequence" in f.summary
    # a real error on a rank is never blamed on a silent one (torchrun stops the others with a signal)
    f = first_crash([_crash(0, 100.0, "ValueError", "bad shard")], silent_ranks=[1])
    assert f is not None and f.cause != "rank-vanished" and f.exception == "ValueError"


def test_a_rank_done_with_its_shard_has_not_stopped() -> None:
    # uneven data under DDP's Join: rank 1 runs out of batches at step 90 and finishes its probe
    rows: list[dict[str, Any]] = [r for r in _rows(100) if not (r["rank"] == 1 and r["step"] > 90)]
    at = next(i for i, r in enumerate(rows) if r["rank"] == 1 and r["step"] == 90)
    rows.insert(at + 1, {"kind": "probe", "name": "finish", "rank": 1, "t": rows[at]["t"], "step": 90})
    assert _names(run_rules(rows, {**DDP, "total_steps": 100})) == []
