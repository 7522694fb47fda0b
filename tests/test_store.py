"""The store's writer keeps what it could not write: a locked or unwritable database loses no rows."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

from tgtest import run_trainguard

from trainguard.store.reader import RunReader
from trainguard.store.writer import StoreWriter


def test_rows_survive_a_database_that_is_locked_for_a_while(tmp_path: Path) -> None:
    writer = StoreWriter(tmp_path)
    writer._conn.execute("PRAGMA busy_timeout=100")  # fail fast instead of waiting 10 s
    blocker = sqlite3.connect(tmp_path / "run.db", timeout=1)
    blocker.execute("BEGIN IMMEDIATE")  # another process holds the write lock
    for step in range(1, 6):
        writer.add_step({"step": step, "t": float(step), "loss": 1.0 / step})
    writer.add_event("eval", None, {"loss": 0.5}, step=5)
    assert writer.flush() == 0  # could not write: nothing raised, nothing dropped
    assert writer.last_error and "locked" in writer.last_error
    blocker.rollback()
    blocker.close()
    assert writer.flush() == 6
    writer.close()
    with RunReader(tmp_path) as reader:
        assert [r["step"] for r in reader.steps()] == [1, 2, 3, 4, 5]
        assert len(reader.events("eval")) == 1


NAN_END_SCRIPT = '''
import sys, torch, trainguard
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
guard = trainguard.watch(model, opt, total_steps=12, run_dir=sys.argv[1] if len(sys.argv) > 1 else None)
for step in range(1, 13):
    loss = model(torch.randn(8, 4)).pow(2).mean()
    if step >= 10:
        loss = loss * float("nan")
    print(f"iter {step}: loss {loss.item():.4f}", flush=True)
    guard.step(loss)
guard.finish()
'''


def _strict(text: str) -> dict:
    def refuse(name: str) -> None:
        raise ValueError(f"status.json holds a bare {name}")

    return json.loads(text, parse_constant=refuse)


def test_status_json_is_strict_json_when_the_loss_is_nan(tmp_path: Path) -> None:
    from trainguard.store.status import read_status, write_status

    write_status(tmp_path, {"state": "running", "loss": float("nan"), "lr": float("inf"),
                            "findings": [{"code": "TG301", "severity": "warning", "evidence": {"x": float("-inf")}}]})
    st = _strict((tmp_path / "status.json").read_text())
    assert st["loss"] is None and st["loss_nonfinite"] == "nan" and st["lr_nonfinite"] == "inf"
    assert st["findings"][0]["evidence"] == {"x": None, "x_nonfinite": "-inf"}
    assert read_status(tmp_path)["loss_nonfinite"] == "nan"

    # a real run whose last losses are NaN, alone (the probe writes status.json) and under `trainguard run`
    (tmp_path / "train.py").write_text(NAN_END_SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINGUARD_")}
    proc = subprocess.run([sys.executable, "train.py", str(tmp_path / "alone")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    proc = run_trainguard("run", "--quiet", "--fail-on", "never", "--run-dir", str(tmp_path / "watched"), "--",
                          sys.executable, "train.py", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr  # the command's own code: the NaN findings are not this test's
    for name in ("alone", "watched"):
        st = _strict((tmp_path / name / "status.json").read_text())
        assert st["loss"] is None and st["loss_nonfinite"] == "nan", (name, st)
        assert any(f["name"] == "nonfinite-loss" for f in st["findings"]), name
    # the script's own guard measured the loss: the watchdog kept none of the printed ones beside it
    from trainguard.store.printed import read_printed

    assert "iter 12: loss nan" in (tmp_path / "watched" / "output.log").read_text()
    assert read_printed(tmp_path / "watched") == []


def test_each_rank_records_its_node_and_host_and_an_old_store_reads_without_them(tmp_path: Path) -> None:
    from trainguard.store.ranks import describe, rank_info

    # two nodes of two ranks each, as torchrun --nnodes=2 --nproc_per_node=2 sets their environments
    for rank in range(4):
        env = {"RANK": str(rank), "LOCAL_RANK": str(rank % 2), "GROUP_RANK": str(rank // 2), "WORLD_SIZE": "4",
               "LOCAL_WORLD_SIZE": "2"}
        w = StoreWriter(tmp_path, rank=rank)
        w.set_rank_info(rank_info(env))
        w.add_step({"step": 1, "t": 1.0, "loss": 1.0})
        w.close()
    info = RunReader(tmp_path).ranks()
    assert sorted(info) == [0, 1, 2, 3]
    assert [info[r]["node"] for r in range(4)] == [0, 0, 1, 1]
    assert [info[r]["local_rank"] for r in range(4)] == [0, 1, 0, 1]
    assert info[3]["world_size"] == 4 and info[3]["local_world_size"] == 2 and info[3]["host"]
    assert describe(3, info) == "rank 3 (node 1)"  # two simulated nodes on one host
    assert describe(3, {r: {**info[r], "node": 0} for r in info}) == "rank 3"  # one node: nothing to add
    info[3]["host"] = "gpu-b"
    assert describe(3, info) == "rank 3 (node 1, gpu-b)"
    # Slurm without torchrun; a plain process; an odd value from a launcher falls back, never raises
    assert rank_info({"SLURM_PROCID": "5", "SLURM_NODEID": "2"})["rank"] == 5
    assert rank_info({})["rank"] == 0 and rank_info({})["world_size"] == 1
    assert rank_info({"RANK": "x", "SLURM_PROCID": "1"})["rank"] == 1

    # a store written before the table existed reads back with no ranks (read-only: nothing is created)
    old = tmp_path / "old"
    old.mkdir()
    conn = sqlite3.connect(old / "run.db")
    conn.executescript("CREATE TABLE steps (rank INTEGER, step INTEGER, t REAL); CREATE TABLE events (id INTEGER);")
    conn.close()
    assert RunReader(old).ranks() == {}


def test_a_paced_flush_is_one_transaction_that_a_reader_never_sees_half_of(tmp_path: Path) -> None:
    # The probe's background thread flushes with pauses between slices of rows (store/writer.py
    # COMMIT_SLICE): the rows still land in one transaction, so a reader looking during a pause sees none.
    from trainguard.store.writer import COMMIT_SLICE

    w = StoreWriter(tmp_path)
    n = 3 * COMMIT_SLICE + 5
    for step in range(1, n + 1):
        w.add_step({"step": step, "t": 1000.0 + step, "loss": 1.0 / step, "weights": {"a": 0.5}, "parts": {"x": 1.0}})
    seen_during: list[int] = []

    def pause() -> None:
        with sqlite3.connect(tmp_path / "run.db", timeout=5) as db:
            seen_during.append(db.execute("select count(*) from steps").fetchone()[0])

    assert w.flush(pause=pause) == n
    assert seen_during == [0, 0, 0, 0]  # a chance to pause before each slice, the rows not committed yet
    w.close()
    with RunReader(tmp_path) as reader:
        rows = list(reader.steps())
    assert [r["step"] for r in rows] == list(range(1, n + 1))
    assert rows[-1]["weights"] == {"a": 0.5} and rows[-1]["parts"] == {"x": 1.0}


def test_each_step_row_keeps_its_own_weights_when_they_change(tmp_path: Path) -> None:
    # (the writer encodes a run's weights once while they stay the same)
    w = StoreWriter(tmp_path)
    given = [{"a": 0.5}, {"a": 0.5}, None, {"a": 0.25, "b": 1.0}, {"a": 0.25, "b": 1.0}, {"a": float("nan")}]
    for step, weights in enumerate(given, start=1):
        w.add_step({"step": step, "t": float(step), "loss": 1.0, "weights": weights})
    w.close()
    with RunReader(tmp_path) as reader:
        stored = [r["weights"] for r in reader.steps()]
    assert stored[:5] == [{"a": 0.5}, {"a": 0.5}, {}, {"a": 0.25, "b": 1.0}, {"a": 0.25, "b": 1.0}]
    assert str(stored[5]["a"]) == "nan"
