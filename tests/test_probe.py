"""The probe inside a real torch loop: its numbers against a plain torch reference, counting, fail-open.

Run: pytest tests/test_probe.py
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import trainguard
from trainguard.store.reader import RunReader


def _loop(run_dir: Path, *, steps: int = 12, grad_accum: int = 2, model: torch.nn.Module | None = None,
          opt_params=None, stats_every: int = 1):
    torch.manual_seed(0)
    model = model or torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(opt_params if opt_params is not None else model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.5)
    guard = trainguard.watch(model, opt, sched, total_steps=steps, grad_accum=grad_accum, run_dir=run_dir,
                             stats_every=stats_every)
    reference = []
    for _ in range(steps):
        micro_losses = []
        for _ in range(grad_accum):
            x = torch.randn(4, 8)
            loss = model(x).pow(2).mean()
            (loss / grad_accum).backward()
            micro_losses.append(loss.item())
            guard.step(loss, parts={"a": loss * 0.25, "b": 0.5}, weights={"a": 1.0, "b": 2.0})
            guard.log(align_ratio=torch.tensor(0.75), tokens=128)
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])).item() if grads else None
        reference.append({"loss": sum(micro_losses) / grad_accum, "lr": opt.param_groups[0]["lr"], "grad_norm": norm})
        opt.step()
        sched.step()
        opt.zero_grad()
    guard.finish()
    return guard, reference


def test_step_rows_match_a_plain_torch_reference(tmp_path: Path) -> None:
    guard, ref = _loop(tmp_path / "run")
    with RunReader(guard.run_dir) as reader:
        rows = list(reader.steps())
    assert [r["step"] for r in rows] == list(range(1, len(ref) + 1))
    for row, want in zip(rows, ref):
        assert row["loss"] == pytest.approx(want["loss"], rel=1e-5)
        assert row["lr"] == pytest.approx(want["lr"])
        assert row["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-4)
        assert row["parts"]["a"] == pytest.approx(want["loss"] * 0.25, rel=1e-5)
        assert row["parts"]["b"] == pytest.approx(0.5)
        assert row["weights"] == {"a": 1.0, "b": 2.0}
        assert row["extra"]["align_ratio"] == pytest.approx(0.75) and row["extra"]["tokens"] == 128
        assert row["nonfinite"] == 0
        assert row["update_ratio"] > 0
    assert rows[-1]["micro"] == 2 * len(ref)
    # scheduler.last_epoch at each optimizer step: stepped once per optimizer step here
    assert [r["sched_epoch"] for r in rows] == list(range(len(ref)))


def test_update_ratio_is_zero_when_the_optimizer_holds_other_parameters(tmp_path: Path) -> None:
    model = torch.nn.Linear(8, 1)
    other = torch.nn.Linear(8, 1)
    guard, _ = _loop(tmp_path / "run", model=model, opt_params=other.parameters())
    with RunReader(guard.run_dir) as reader:
        ratios = [r["update_ratio"] for r in reader.steps() if r["update_ratio"] is not None]
        ev = reader.events("params-not-in-optimizer")
    assert ratios and all(r == 0.0 for r in ratios)
    assert ev and ev[0]["data"]["count"] == 2


def test_nonfinite_values_are_kept_not_hidden(tmp_path: Path) -> None:
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    guard = trainguard.watch(model, opt, run_dir=tmp_path / "run", stats_every=1)
    for i in range(4):
        loss = model(torch.randn(2, 4)).mean() * (float("nan") if i == 2 else 1.0)
        loss.backward()
        opt.step()
        opt.zero_grad()
        guard.step(loss)
    guard.finish()
    with RunReader(guard.run_dir) as reader:
        rows = list(reader.steps())
    assert math.isnan(rows[2]["loss"]) and rows[2]["nonfinite"] == 1
    assert math.isfinite(rows[1]["loss"])


def test_due_answers_once_per_step_every_n_steps(tmp_path: Path) -> None:
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    guard = trainguard.watch(model, opt, grad_accum=3, run_dir=tmp_path / "run")
    fired = []
    for _ in range(10):
        for _ in range(3):
            model(torch.randn(2, 4)).mean().backward()
            guard.step(torch.tensor(1.0))
            if guard.due("eval", every=4):  # asked once per micro-batch
                fired.append(guard.step_count)
        opt.step()
        opt.zero_grad()
        if guard.due("eval", every=4):
            fired.append(guard.step_count)
    guard.finish()
    assert fired == [4, 8]


def test_the_guard_never_raises_into_the_loop(tmp_path: Path) -> None:
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    guard = trainguard.watch(model, opt, run_dir=tmp_path / "run")
    for _ in range(3):
        model(torch.randn(2, 4)).mean().backward()
        opt.step()
        opt.zero_grad()
        guard.step("not a number")  # a user mistake inside the guard: logged, not raised
        guard.step(object(), parts={"x": object()})
    guard.eval(loss=object())
    guard.finish()
    log = (tmp_path / "run" / "guard.log").read_text()
    assert "error in step" in log
    assert log.count("error in step: ValueError") == 1  # the same error is written once, then counted


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_leaves_the_parents_guard_alone(tmp_path: Path) -> None:
    # The hot path knows its process by an id read once and refreshed at each fork (probe/thisprocess.py),
    # not by a getpid() per call: a child that runs the loop's code must still count and record nothing.
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    guard = trainguard.watch(model, opt, run_dir=tmp_path / "run")

    def one_step() -> None:
        loss = model(torch.randn(2, 4)).pow(2).mean()
        loss.backward()
        guard.step(loss)
        opt.step()
        opt.zero_grad()

    one_step()
    pid = os.fork()
    if pid == 0:  # the child (a forked DataLoader worker, say) runs a step: the guard's calls and hooks
        code = 1
        try:
            before = (guard.micro, guard.opt_steps, len(guard.probe.pending))
            one_step()
            code = 0 if (guard.micro, guard.opt_steps, len(guard.probe.pending)) == before else 3
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    one_step()
    guard.finish()
    with RunReader(guard.run_dir) as reader:
        assert [r["step"] for r in reader.steps()] == [1, 2]


def test_disabled_guard_still_counts_steps_for_due(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINGUARD_DISABLE", "1")
    guard = trainguard.watch(None, None, grad_accum=2)
    assert type(guard).__name__ == "NullGuard"
    hits = []
    for _ in range(8):
        guard.step(1.0)
        if guard.due("eval", every=2):
            hits.append(guard.step_count)
    assert hits == [2, 4]


def test_import_trainguard_does_not_import_torch() -> None:
    code = "import sys, trainguard; assert 'torch' not in sys.modules, 'torch imported'; print('light')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "light" in out.stdout


WRITER = """
import os, sys, torch, trainguard
torch.manual_seed(int(os.environ["RANK"]))
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
guard = trainguard.watch(model, opt, total_steps=300, run_dir=sys.argv[1])
for _ in range(300):
    loss = model(torch.randn(2, 4)).pow(2).mean()
    loss.backward(); opt.step(); opt.zero_grad()
    guard.step(loss)
    guard.eval(loss=0.5) if guard.due("eval", every=50) else None
guard.finish()
"""


def test_several_ranks_write_one_store_without_corrupting_it(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    procs = [
        subprocess.Popen([sys.executable, str(script), str(run_dir)], env={**os.environ, "RANK": str(r)},
                         stderr=subprocess.PIPE, text=True)
        for r in range(3)
    ]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    conn = sqlite3.connect(run_dir / "run.db")
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    counts = dict(conn.execute("SELECT rank, COUNT(*) FROM steps GROUP BY rank").fetchall())
    assert counts == {0: 300, 1: 300, 2: 300}
    assert conn.execute("SELECT COUNT(*) FROM events WHERE kind='eval'").fetchone()[0] == 18
    assert not (run_dir / "guard.log").exists()


def test_standalone_crash_writes_a_crashed_status(tmp_path: Path) -> None:
    script = tmp_path / "crash.py"
    script.write_text(
        "import torch, trainguard\n"
        "m = torch.nn.Linear(2, 1); o = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "g = trainguard.watch(m, o, total_steps=10)\n"
        "for i in range(10):\n"
        "    m(torch.randn(2, 2)).sum().backward(); o.step(); o.zero_grad(); g.step(torch.tensor(1.0))\n"
        "    if i == 4:\n"
        "        with g.phase('eval'):\n"
        "            None % 500\n"
    )
    out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                         env={k: v for k, v in os.environ.items() if k != "TRAINGUARD_RUN_DIR"})
    assert out.returncode == 1
    (run,) = (tmp_path / "trainguard-runs").iterdir()
    status = json.loads((run / "status.json").read_text())
    assert status["state"] == "crashed"
    (f,) = status["findings"]
    assert f["name"] == "run-crashed" and f["exception"] == "TypeError" and f["step"] == 5
    assert f["where"].endswith("crash.py:8 (<module>)")
    assert "phase 'eval' (the first time this phase ran" in f["summary"]


def test_standalone_exit_without_finish_is_not_completed(tmp_path: Path) -> None:
    script = tmp_path / "nofinish.py"
    script.write_text(
        "import torch, trainguard\n"
        "m = torch.nn.Linear(2, 1); o = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "g = trainguard.watch(m, o, total_steps=10)\n"  # it stops at 5: early (tests/test_endings.py has the rest)
        "for i in range(5):\n"
        "    m(torch.randn(2, 2)).sum().backward(); o.step(); o.zero_grad(); g.step(torch.tensor(1.0))\n"
    )
    out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                         env={k: v for k, v in os.environ.items() if k != "TRAINGUARD_RUN_DIR"})
    assert out.returncode == 0, out.stderr
    (run,) = (tmp_path / "trainguard-runs").iterdir()
    status = json.loads((run / "status.json").read_text())
    assert status["state"] == "failed"
    assert [f["name"] for f in status["findings"]] == ["probe-not-finished"]


def test_set_step_continues_a_resumed_run(tmp_path: Path) -> None:
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    guard = trainguard.watch(model, opt, grad_accum=2, run_dir=tmp_path / "run")
    guard.set_step(1000)  # as a script does after loading its checkpoint
    fired = []
    for _ in range(6):
        for _ in range(2):
            model(torch.randn(2, 4)).mean().backward()
            guard.step(torch.tensor(1.0))
        opt.step()
        opt.zero_grad()
        if guard.due("eval", every=5):
            fired.append(guard.step_count)
    guard.finish()
    with RunReader(guard.run_dir) as reader:
        steps = [r["step"] for r in reader.steps()]
    assert steps == list(range(1001, 1007))
    assert fired == [1005]


def test_a_guard_that_switched_itself_off_still_finishes(tmp_path: Path) -> None:
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    guard = trainguard.watch(model, opt, run_dir=tmp_path / "run")
    for _ in range(30):
        guard.step({"not": "a loss"})  # 30 errors of its own: the guard switches itself off after 20
    guard.finish()
    assert guard.state.disabled
    with RunReader(tmp_path / "run") as reader:
        assert [e["name"] for e in reader.events("probe")].count("finish") == 1
    assert json.loads((tmp_path / "run" / "status.json").read_text())["state"] == "completed"


def test_a_crash_after_one_run_finished_is_not_that_runs_crash(tmp_path: Path) -> None:
    script = tmp_path / "two.py"
    script.write_text(
        "import sys, torch, trainguard\n"
        "m = torch.nn.Linear(2, 1); o = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "g1 = trainguard.watch(m, o, run_dir=sys.argv[1] + '/a'); g1.step(torch.tensor(1.0)); g1.finish()\n"
        "g2 = trainguard.watch(m, None, run_dir=sys.argv[1] + '/b'); g2.step(torch.tensor(1.0))\n"
        "raise RuntimeError('the second run fails')\n"
    )
    out = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert json.loads((tmp_path / "a" / "status.json").read_text())["state"] == "completed"
    assert json.loads((tmp_path / "b" / "status.json").read_text())["state"] == "crashed"


def test_log_without_step_is_stored_with_the_optimizer_steps(tmp_path: Path) -> None:
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    guard = trainguard.watch(model, opt, run_dir=tmp_path / "run")
    for i in range(20):
        loss = model(torch.randn(2, 4)).pow(2).mean()
        loss.backward()
        guard.log(acc=torch.tensor(float(i)))
        opt.step()
        opt.zero_grad()
    guard.finish()
    assert guard.probe.pending == []
    with RunReader(tmp_path / "run") as reader:
        accs = [r["extra"].get("acc") for r in reader.steps()]
    assert accs == [float(i) for i in range(20)]


def test_watch_on_an_unwritable_folder_does_not_stop_training(tmp_path: Path, capsys) -> None:
    blocker = tmp_path / "afile"
    blocker.write_text("a file where the run folder should be")
    model = torch.nn.Linear(4, 1)
    guard = trainguard.watch(model, None, run_dir=blocker / "run")
    assert type(guard).__name__ == "NullGuard"
    assert "trainguard: not watching this run" in capsys.readouterr().err
    for _ in range(4):
        guard.step(model(torch.randn(2, 4)).mean())
    assert guard.step_count == 4 and guard.due("eval", every=2) is True  # the loop still gets its evals


def test_tensor_weights_do_not_need_a_sync(tmp_path: Path) -> None:
    model = torch.nn.Linear(4, 1)
    guard = trainguard.watch(model, None, run_dir=tmp_path / "run")
    for _ in range(3):
        loss = model(torch.randn(2, 4)).mean()
        guard.step(loss, parts={"a": loss}, weights={"a": torch.tensor(0.5), "b": 2.0})
    guard.finish()
    with RunReader(tmp_path / "run") as reader:
        assert [r["weights"] for r in reader.steps()] == [{"a": 0.5, "b": 2.0}] * 3


def test_rows_carry_the_scale_each_step_was_taken_at_not_the_one_update_wrote_later(tmp_path: Path) -> None:
    """The GradScaler's scale is rewritten in place by update(); the values are read later, off the
    training thread, so the probe keeps a copy (every row once read the final 32768)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    scaler = torch.amp.GradScaler("cpu")
    guard = trainguard.watch(model, opt, total_steps=12, run_dir=tmp_path / "run", scaler=scaler, stats_every=1)
    for i in range(12):
        loss = model(torch.randn(4, 8)).pow(2).mean()
        if i == 5:
            loss = loss * float("inf")  # an overflow: the scaler skips this step and halves its scale
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        guard.step(loss)
    guard.finish()
    with RunReader(guard.run_dir) as reader:
        scales = [row["loss_scale"] for row in reader.steps()]
    assert scales[:5] == [65536.0] * 5 and scales[6:] == [32768.0] * 6


def test_a_step_the_scaler_skipped_keeps_its_own_scale_in_its_row(tmp_path: Path) -> None:
    """guard.step before scaler.step, fp16 on the CPU: the first step overflows and is skipped, so the
    optimizer's first record is the second step's; the row still says the scale its loss was scaled by."""
    torch.manual_seed(0)
    model = torch.nn.Linear(32, 1)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    scaler = torch.amp.GradScaler("cpu")
    guard = trainguard.watch(model, opt, total_steps=10, run_dir=tmp_path / "run", scaler=scaler, stats_every=1)
    kept = []
    for _ in range(10):
        with torch.autocast("cpu", dtype=torch.float16):
            loss = model(torch.randn(16, 32)).float().pow(2).mean()
        scaler.scale(loss).backward()
        guard.step(loss)
        kept.append(scaler._scale.item())
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
    guard.finish()
    with RunReader(guard.run_dir) as reader:
        assert [row["loss_scale"] for row in reader.steps()] == kept


def test_a_waiting_run_does_not_rewrite_its_heartbeat_at_every_flush(tmp_path: Path) -> None:
    """The background thread queues the heartbeat only when it changed (issue 21: an unchanged one cost a
    commit at every flush of a run that waits, an evaluation, a checkpoint); progress shows at once."""
    import time

    from trainguard.probe.drain import BEAT_REFRESH, FLUSH_INTERVAL

    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    guard = trainguard.watch(model, opt, total_steps=100, run_dir=tmp_path / "run")

    def step() -> None:
        loss = model(torch.randn(2, 4)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        guard.step(loss)

    def beat() -> tuple[float, int]:
        with RunReader(tmp_path / "run") as reader:
            (b,) = reader.heartbeats()
        return b["t_flush"], b["step"]

    try:
        for _ in range(3):
            step()
        time.sleep(3 * FLUSH_INTERVAL)
        first = beat()
        assert first[1] == 3
        time.sleep(min(4 * FLUSH_INTERVAL, BEAT_REFRESH - 1.0))  # several flushes, nothing new to say
        assert beat() == first
        step()
        time.sleep(3 * FLUSH_INTERVAL)
        t_flush, at = beat()
        assert at == 4 and t_flush > first[0]
    finally:
        guard.finish()


def test_a_loaders_batches_never_kept_are_no_longer_offered_to_the_ring(tmp_path: Path) -> None:
    # batches on a device are never kept (the ring holds host data only); after NOT_KEPT_IN_A_ROW of them
    # the loader's batches are not offered again, which saves two calls a micro-batch
    from trainguard.probe.guard import NOT_KEPT_IN_A_ROW

    guard = trainguard.watch(run_dir=tmp_path / "device")
    on_device = [(torch.empty(2, device="meta"), torch.empty(2, device="meta"))] * (NOT_KEPT_IN_A_ROW + 4)
    then_host = [(torch.zeros(2), torch.ones(2))] * 3
    assert len(list(guard.batches(on_device + then_host))) == NOT_KEPT_IN_A_ROW + 7
    assert len(guard.probe.ring.items) == 0
    guard.finish()
    # a loader of host batches keeps its batches (for the NaN batch's replay), as does one that starts on a device
    guard = trainguard.watch(run_dir=tmp_path / "host")
    list(guard.batches(on_device[:3] + then_host))
    assert len(guard.probe.ring.items) == 3
    guard.finish()


def test_a_device_interval_is_read_only_once_its_events_completed_and_never_waited_for() -> None:
    from trainguard.probe import devicestats

    class Event:
        def __init__(self, done: bool, ms: float = 0.0, fails: bool = False) -> None:
            self.done, self.ms, self.fails = done, ms, fails

        def query(self) -> bool:
            return self.done

        def elapsed_time(self, end: Event) -> float:
            if self.fails or end.fails:
                raise RuntimeError("CUDA error: device not ready")
            return end.ms - self.ms

    assert devicestats.elapsed(Event(True, 10.0), Event(True, 42.0)) == pytest.approx(0.032)
    assert devicestats.elapsed(Event(True), Event(False)) is None  # not done: asked again never, left out
    assert devicestats.elapsed(Event(True, fails=True), Event(True)) is None  # another device, a lost context
    assert devicestats.elapsed(Event(True, 5.0), Event(True, 1.0)) is None  # recorded on another stream


def test_the_straggler_measures_optimizer_hook_fails_open(tmp_path: Path) -> None:
    """In a distributed GPU run the straggler measure records a CUDA event in the optimizer's pre-hook;
    whatever that raises (here: this CPU build has no CUDA, as a sticky device error would) goes to the
    guard's log and takes the measure off, never out of `optimizer.step()`."""
    from trainguard.probe import syncwait

    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    guard = trainguard.watch(model, opt, run_dir=tmp_path / "run")
    measure = syncwait.SyncWait(guard.probe)  # (attach() takes it only with 2+ ranks)
    measure.device = torch.device("cuda", 0)  # as for a model on a GPU
    for _ in range(3):
        model(torch.randn(8, 4)).pow(2).mean().backward()
        opt.step()  # must not raise
        opt.zero_grad()
    guard.finish()
    assert measure.failed and guard.opt_steps == 3
    assert "sync-wait measure" in (tmp_path / "run" / "guard.log").read_text()


def test_device_intervals_go_with_steps_also_without_guard_step(tmp_path: Path) -> None:
    """A loop driven by the optimizer hooks alone (no `guard.step`) hands each step's device intervals to
    that step, as it does `guard.log()`'s values: none is held past its step."""
    class Done:  # a completed pair of timing events: 2 ms apart
        def query(self) -> bool:
            return True

        def elapsed_time(self, other: object) -> float:
            return 2.0

    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    guard = trainguard.watch(model, opt, run_dir=tmp_path / "run")
    opt.register_step_pre_hook(lambda *a: guard.probe.add_interval("x:presync_device_s", Done(), Done()))
    for _ in range(50):
        model(torch.randn(8, 4)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        assert len(guard.probe.intervals) == 0
    guard.finish()
    rows = list(RunReader(tmp_path / "run").steps())
    assert len(rows) == 50 and all((r.get("extra") or {}).get("presync_device_s") == 0.002 for r in rows), rows[:2]
