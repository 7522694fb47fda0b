"""The probe's fast-forward mode (probe/fastforward.py), driven in-process with real torch and a real store.

Each test sets TRAINGUARD_PREFLIGHT as `trainguard preflight` does (without a scratch folder, so no audit
hook lands in the test process) and runs a small real training loop until the guard stops it.
Run: pytest tests/test_preflight_fastforward.py
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import trainguard
from trainguard.contract import ENV_PREFLIGHT
from trainguard.probe.fastforward import PreflightStop
from trainguard.store.reader import RunReader


def _setup(monkeypatch: pytest.MonkeyPatch, mode: str = "first", steps: int = 3) -> None:
    monkeypatch.setenv(ENV_PREFLIGHT, json.dumps({"mode": mode, "steps": steps}))


def _model():
    model = torch.nn.Linear(4, 1)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def _update(opt: torch.optim.Optimizer, loss: torch.Tensor | None = None) -> None:
    if loss is not None:
        loss.backward()
    opt.step()
    opt.zero_grad()


def _events(run_dir: Path) -> list[tuple[str, dict, int]]:
    with RunReader(run_dir) as r:
        return [(e["name"], e["data"], e["step"]) for e in r.events("preflight")]


def test_due_brought_forward_once_with_real_step_then_clean_stop(workdir: Path, monkeypatch) -> None:
    _setup(monkeypatch, steps=3)
    model, opt = _model()
    guard = trainguard.watch(model, opt, total_steps=10_000, run_dir=workdir / "run")
    ran: dict[str, list[int]] = {"eval": [], "save": []}
    with pytest.raises(PreflightStop) as stop:
        for _ in range(10_000):
            loss = model(torch.randn(2, 4)).pow(2).mean()
            _update(opt, loss)
            guard.step(loss)
            if guard.due("eval", every=2000):
                ran["eval"].append(guard.step_count)
            if guard.due("save", every=5000):
                ran["save"].append(guard.step_count)
    assert stop.value.code == 0
    assert ran == {"eval": [3], "save": [3]}  # once each, at the real step counter, not at 2000/5000
    assert guard.finished and guard.step_count == 5  # stopped SETTLE_STEPS after the last new path
    names = [n for n, _, _ in _events(workdir / "run")]
    assert names.count("forced") == 2 and names[-1] == "stop"


def test_forced_only_between_optimizer_steps(workdir: Path, monkeypatch) -> None:
    _setup(monkeypatch, steps=2)
    model, opt = _model()
    guard = trainguard.watch(model, opt, total_steps=1000, grad_accum=4, run_dir=workdir / "run")
    micro_at_due = []
    with pytest.raises(PreflightStop):
        for micro in range(1, 4001):
            loss = model(torch.randn(2, 4)).pow(2).mean()
            loss.backward()
            guard.step(loss)
            if micro % 4 == 0:
                _update(opt)
            if guard.due("eval", every=500):
                micro_at_due.append(micro)
    assert micro_at_due == [8]  # right after the second optimizer step closed, never mid-window


def test_epoch_cut_and_reiteration(workdir: Path, monkeypatch) -> None:
    _setup(monkeypatch, steps=3)
    model, opt = _model()
    loader = torch.utils.data.DataLoader(torch.randn(400, 4), batch_size=4)
    guard = trainguard.watch(model, opt, total_steps=300, run_dir=workdir / "run")
    epochs_started = 0
    with pytest.raises(PreflightStop):
        for _epoch in range(3):
            epochs_started += 1
            for x in guard.batches(loader):
                loss = model(x).pow(2).mean()
                _update(opt, loss)
                guard.step(loss)
    assert epochs_started == 2  # the first pass was ended at step 3; the second began, then the stop
    events = {n: d for n, d, _ in _events(workdir / "run")}
    assert events["epoch-cut"]["step"] == 3 and events["epoch-cut"]["len"] == 100
    assert "reiterate-ok" in events and events["stop"]["step"] >= 5


@pytest.mark.filterwarnings("ignore:Detected call")
def test_schedule_simulated_from_the_real_stepping(workdir: Path, monkeypatch) -> None:
    _setup(monkeypatch, steps=3)
    model, opt = _model()
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: max(0.0, 1 - s / 100))  # sized for 100 steps
    guard = trainguard.watch(model, opt, sched, total_steps=100, grad_accum=4, run_dir=workdir / "run")
    with pytest.raises(PreflightStop):
        for micro in range(1, 401):
            loss = model(torch.randn(2, 4)).pow(2).mean()
            loss.backward()
            guard.step(loss)
            if micro % 4 == 0:
                _update(opt)
            sched.step()  # per micro-batch: 4x too fast
    sim = json.loads((workdir / "run" / "schedule.json").read_text())
    assert sim["ratio"] == 4 and sim["flat_from"] == 26  # the LR is at zero from optimizer step 26 of 100
    assert sched.last_epoch < 40  # the real scheduler was not stepped by the simulation
    assert opt.param_groups[0]["lr"] > 0


def test_resume_mode_stops_after_its_steps(workdir: Path, monkeypatch) -> None:
    _setup(monkeypatch, mode="resume", steps=2)
    monkeypatch.setenv("TRAINGUARD_RESUME_FROM", "ckpt.pt")
    model, opt = _model()
    guard = trainguard.watch(model, opt, total_steps=100, run_dir=workdir / "run")
    assert guard.resume_from == "ckpt.pt"
    forced = []
    with pytest.raises(PreflightStop):
        for _ in range(100):
            loss = model(torch.randn(2, 4)).pow(2).mean()
            _update(opt, loss)
            guard.step(loss)
            forced.append(guard.due("eval", every=50))
    assert guard.step_count == 2 and not any(forced)  # nothing is brought forward on resume
    assert "resume-read" in [n for n, _, _ in _events(workdir / "run")]


def test_without_env_nothing_changes(workdir: Path, monkeypatch) -> None:
    monkeypatch.delenv(ENV_PREFLIGHT, raising=False)
    model, opt = _model()
    guard = trainguard.watch(model, opt, total_steps=30, run_dir=workdir / "run")
    hits = []
    for _ in range(30):
        loss = model(torch.randn(2, 4)).pow(2).mean()
        _update(opt, loss)
        guard.step(loss)
        if guard.due("eval", every=10):
            hits.append(guard.step_count)
    guard.finish()
    assert hits == [10, 20, 30] and guard._ff is None
