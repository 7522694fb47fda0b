"""Checkpoint verification under `trainguard run` (issue 37): the watchdog verifies what the script reports
and what it saw the script write, outside the training process; a restart resumes only from a verified
checkpoint. Real scripts, real torch files, the real CLI.

    PYTHONPATH=src python -m pytest -p no:xdist -q tests/test_checkpoint_watchdog.py
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest
from tgtest import run_trainguard

pytest.importorskip("torch")
pytestmark = pytest.mark.process

REPORTED = textwrap.dedent('''
    import io, time, torch, trainguard
    model = torch.nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    guard = trainguard.watch(model, opt, total_steps=30)
    for step in range(1, 31):
        loss = model(torch.randn(4, 8)).pow(2).mean()
        opt.zero_grad(); loss.backward(); opt.step(); guard.step(loss)
        if step in (10, 30):
            sd = {k: v.clone() for k, v in model.state_dict().items()}
            if step == 30:
                sd["weight"][1, 1] = float("nan")
            torch.save({"model": sd, "step": step}, f"ck-{step}.pt")
            guard.checkpoint_saved(f"ck-{step}.pt")
    # a save nobody reports, slow enough for the watchdog to see it written: poisoned too
    buf = io.BytesIO()
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    sd["bias"][0] = float("nan")
    torch.save({"model": sd, "step": 30}, buf)
    data = buf.getvalue()
    with open("unreported/last.pt", "wb") as fh:
        fh.write(data[:100]); fh.flush()
        time.sleep(3.0)
        fh.write(data[100:])
    time.sleep(3.0)
    guard.finish()
''')


def test_watchdog_verifies_reported_and_written_checkpoints(workdir: Path) -> None:
    (workdir / "train.py").write_text(REPORTED)
    (workdir / "unreported").mkdir()
    r = run_trainguard("run", "--quiet", "--run-dir", "run", "--", sys.executable, "train.py", cwd=workdir,
                       timeout=240)
    assert r.returncode == 122, r.stderr  # completed with the error finding of its poisoned checkpoint
    from trainguard.store.reader import RunReader

    with RunReader(workdir / "run") as reader:
        checks = {Path(c["data"]["path"]).name: c["data"] for c in reader.events("checkpoint-check")}
    assert checks["ck-10.pt"]["status"] == "verified" and checks["ck-10.pt"]["rank"] == 0
    assert checks["ck-30.pt"]["status"] == "poisoned"
    assert checks["last.pt"]["status"] == "poisoned" and checks["last.pt"]["reported"] is False
    status = json.loads((workdir / "run" / "status.json").read_text())
    poisoned = [f for f in status["findings"] if f["name"] == "checkpoint-poisoned"]
    assert poisoned and poisoned[0]["severity"] == "error" and "ck-10.pt" in poisoned[0]["fix"]
    report = (workdir / "run" / "report.md").read_text()
    assert "checkpoint verified" in report and "POISONED" in report


HANGS = textwrap.dedent('''
    import json, os, threading, time, torch, trainguard
    guard = trainguard.watch()
    with open("attempts.jsonl", "a") as fh:
        fh.write(json.dumps({"attempt": os.environ.get("TRAINGUARD_ATTEMPT"), "resume_from": guard.resume_from}) + "\\n")
    if guard.resume_from is not None:
        guard.finish()
        raise SystemExit(0)
    for step in range(1, 21):
        guard.step(1.0)
        if step in (10, 20):
            w = torch.ones(4) if step == 10 else torch.full((4,), float("nan"))
            torch.save({"w": w, "step": step}, f"ck-{step}.pt")
            guard.checkpoint_saved(f"ck-{step}.pt")
        time.sleep(0.05)
    threading.Event().wait()
''')


def test_restart_resumes_from_the_newest_verified_checkpoint(workdir: Path) -> None:
    (workdir / "train.py").write_text(HANGS)
    r = run_trainguard("run", "--quiet", "--run-dir", "run", "--stall-timeout", "3", "--hang-limit", "8",
                       "--on-hang", "restart", "--", sys.executable, "train.py", cwd=workdir, timeout=240)
    attempts = [json.loads(line) for line in (workdir / "attempts.jsonl").read_text().splitlines()]
    assert len(attempts) == 2, r.stderr
    assert attempts[1]["resume_from"] == str((workdir / "ck-10.pt").resolve()), r.stderr
    assert "skipped newer checkpoint(s) that failed verification" in r.stderr and "ck-20.pt (poisoned)" in r.stderr


STALL_AFTER_XID = textwrap.dedent('''
    import threading, time, trainguard
    from trainguard.devices.kmsg import parse_line
    from trainguard.devices.sampler import DeviceSampler
    guard = trainguard.watch()
    # the telemetry as the probe's sampler records it on a GPU (its sample rows and its `_event` path)
    sampler = DeviceSampler(guard.writer, rank=0, local_rank=0, log=print, step_of=lambda: guard.step_count)
    for step in range(1, 11):
        guard.step(1.0)
        time.sleep(0.05)
    guard.writer.add_event("device-sample", "gpu", {"gpu": 0, "pci": "0000:3b:00", "host": sampler.host})
    sampler._event(parse_line("NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=python, GPU has fallen off the bus."))
    threading.Event().wait()  # what a process does when its GPU is gone: waits for it forever
''')


def test_a_stall_after_an_xid_names_it(workdir: Path) -> None:
    (workdir / "train.py").write_text(STALL_AFTER_XID)
    r = run_trainguard("run", "--quiet", "--run-dir", "run", "--stall-timeout", "3", "--hang-limit", "6", "--",
                       sys.executable, "train.py", cwd=workdir, timeout=180)
    status = json.loads((workdir / "run" / "status.json").read_text())
    stalls = [f for f in status["findings"] if f["name"] in ("run-stalled", "run-hung")]
    assert stalls, r.stderr
    assert any("Xid 79 (GPU has fallen off the bus)" in f["summary"] for f in stalls), [f["summary"] for f in stalls]
    assert any(f["name"] == "device-fault" for f in status["findings"]), r.stderr
