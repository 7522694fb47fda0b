"""Sinks: a run with a planted NaN and an LR that reaches zero, watched with every sink on, then read back
with each tool's own reader (TensorBoard's EventAccumulator, `wandb leet inspect`, MlflowClient,
prometheus_client's parser). Also: a sink that fails never changes the run's verdict, and bad sink
input is one line and exit 2.

    .venv/bin/python -m pytest -q -n 0 tests/test_sinks.py
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from tgtest import ROOT, run_trainguard

SCRIPT = ROOT / "tests" / "scripts" / "nan_and_lr_zero.py"
PLANTED = {"nonfinite-loss": 30, "lr-reaches-zero": 60}


@pytest.fixture(scope="module")
def watched(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One run under `trainguard run` with the four sinks; W&B offline, MLflow in a file store."""
    work = tmp_path_factory.mktemp("sinks")
    env = {"WANDB_MODE": "offline", "WANDB_DIR": str(work), "MLFLOW_TRACKING_URI": f"file:{work / 'mlruns'}",
           "TRAINGUARD_SINKS": "tensorboard,prometheus"}
    out = run_trainguard("run", "--run-dir", "run", "--sink", "wandb", "--sink", "mlflow", "--",
                         sys.executable, str(SCRIPT), cwd=work, env=env, timeout=240)
    assert out.returncode == 122, out.stderr  # completed with error findings (exitcodes.HEALTH)
    names = {f["name"]: f["step"] for f in json.loads((work / "run" / "status.json").read_text())["findings"]}
    assert {n: names.get(n) for n in PLANTED} == PLANTED, names
    assert not (work / "run" / "guard.log").exists() or "sink" not in (work / "run" / "guard.log").read_text()
    return work


def test_tensorboard_event_files_hold_the_scalars_and_the_findings(watched: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util

    acc = EventAccumulator(str(watched / "run" / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    loss = {e.step: e.value for e in acc.Scalars("trainguard/loss")}
    lr = {e.step: e.value for e in acc.Scalars("trainguard/lr")}
    assert len(loss) == 120 and loss[30] != loss[30]  # the NaN itself, at its step
    assert lr[60] == 0 and lr[10] > 0
    texts = [(e.step, tensor_util.make_ndarray(e.tensor_proto).item().decode())
             for e in acc.Tensors("trainguard/findings")]
    assert any("nonfinite-loss" in t for s, t in texts if s == 30), texts
    assert any("lr-reaches-zero" in t and "fix:" in t for s, t in texts if s == 60), texts
    state = [tensor_util.make_ndarray(e.tensor_proto).item().decode() for e in acc.Tensors("trainguard/state")]
    assert state and state[-1].startswith("**completed**")


def test_wandb_offline_run_has_alerts_summary_and_final_state(watched: Path) -> None:
    wandb_cli = Path(sys.executable).with_name("wandb")
    run_file = next((watched / "wandb").glob("offline-run-*/run-*.wandb"))
    summary = json.loads(subprocess.run([str(wandb_cli), "leet", "inspect", "--summary", "--json", str(run_file)],
                                        capture_output=True, text=True, timeout=120, check=True).stdout)
    assert summary["summary"]["trainguard/state"] == "completed" and summary["exit_code"] == 0
    found = {f["name"]: f["step"] for f in summary["summary"]["trainguard/findings"]}
    assert {n: found.get(n) for n in PLANTED} == PLANTED
    assert summary["summary"]["lr"] == 0
    records = subprocess.run([str(wandb_cli), "leet", "inspect", "--json", str(run_file)], capture_output=True,
                             text=True, timeout=120, check=True).stdout.splitlines()
    alerts = [json.loads(r)["alert"] for r in records if '"type":"alert"' in r]
    titles = {a["title"]: a["level"] for a in alerts}
    assert titles["TG101 lr-reaches-zero"] == "ERROR" and titles["TG301 nonfinite-loss"] == "WARN"


def test_mlflow_file_store_has_metrics_tags_and_status(watched: Path) -> None:
    import os

    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"file:{watched / 'mlruns'}")
    (run,) = client.search_runs([client.get_experiment_by_name("trainguard").experiment_id])
    assert run.info.run_name == "run" and run.info.status == "FINISHED"
    tags = run.data.tags
    assert tags["trainguard.state"] == "completed"
    assert tags["trainguard.finding.TG101"].startswith("lr-reaches-zero [error] at step 60")
    assert tags["trainguard.finding.TG301"].startswith("nonfinite-loss [warning] at step 30")
    lr = {m.step: m.value for m in client.get_metric_history(run.info.run_id, "lr")}
    assert lr[60] == 0 and lr[10] > 0
    local = client.download_artifacts(run.info.run_id, "trainguard/findings.json", str(watched))
    assert {f["name"] for f in json.loads(Path(local).read_text())} >= set(PLANTED)


def test_prometheus_textfile_has_state_and_findings(watched: Path) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    families = {f.name: f for f in text_string_to_metric_families((watched / "run" / "metrics.prom").read_text())}
    (state,) = families["trainguard_run_state"].samples
    assert state.labels["state"] == "completed" and state.value == 1
    found = {s.labels["name"]: s.labels["step"] for s in families["trainguard_finding"].samples}
    assert found["nonfinite-loss"] == "30" and found["lr-reaches-zero"] == "60"
    assert families["trainguard_lr"].samples[0].value == 0
    errors = next(s for s in families["trainguard_findings"].samples if s.labels["severity"] == "error")
    assert errors.value >= 1


def test_a_failing_sink_never_changes_the_verdict(workdir: Path) -> None:
    # a TensorBoard log dir under a file cannot be created: the sink fails, the run does not
    blocker = workdir / "not-a-folder"
    blocker.write_text("a file where the log dir's parent should be")
    out = run_trainguard("run", "--run-dir", "r", "--sink", f"tensorboard={blocker}", "--", sys.executable, "-c",
                         "print('done')", cwd=workdir, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads((workdir / "r" / "status.json").read_text())["state"] == "completed"
    assert "sink tensorboard failed and was switched off" in (workdir / "r" / "guard.log").read_text()
    assert "trainguard: sink tensorboard was switched off" in out.stderr  # said once where the user looks


def test_bad_sink_input_is_one_line_and_exit_2(workdir: Path) -> None:
    for args, env in ((["run", "--sink", "grafana", "--", "true"], {}),
                      (["run", "--", "true"], {"TRAINGUARD_SINKS": "tensorbored"}),
                      (["export", "no-such-run", "--sink", "tensorboard"], {})):
        out = run_trainguard(*args, cwd=workdir, env=env)
        assert out.returncode == 2 and "Traceback" not in out.stderr, (args, out.stderr)
        assert len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_export_copies_a_finished_run(watched: Path) -> None:
    out = run_trainguard("export", str(watched / "run"), "--sink", f"tensorboard={watched / 'tb'}",
                         cwd=watched, timeout=120)
    assert out.returncode == 0 and "tensorboard: written" in out.stdout, out.stderr
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(watched / "tb" / "run"), size_guidance={"tensors": 0})
    acc.Reload()
    assert any(b"lr-reaches-zero" in e.tensor_proto.string_val[0] for e in acc.Tensors("trainguard/findings"))


ENDPOINT_SCRIPT = '''
import sys, time, torch, trainguard
torch.manual_seed(0)
model = torch.nn.Linear(4, 1); opt = torch.optim.SGD(model.parameters(), lr=0.01)
guard = trainguard.watch(model, opt, total_steps=40)
for step in range(1, 41):
    x = torch.randn(8, 4)
    if step == 10:
        x[0, 0] = float("inf")
    loss = model(x).pow(2).mean()
    guard.step(loss)
    if torch.isfinite(loss):
        loss.backward(); opt.step()
    opt.zero_grad()
guard.finish()
time.sleep(float(sys.argv[1]))  # long enough for the test to scrape the endpoint while the run lives
'''


def test_prometheus_endpoint_serves_the_live_run(workdir: Path) -> None:
    import socket
    import time
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families
    from tgtest import trainguard_cmd

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (workdir / "train.py").write_text(ENDPOINT_SCRIPT)
    proc = subprocess.Popen(trainguard_cmd("run", "--run-dir", "r", "--stall-timeout", "120", "--sink",
                                           f"prometheus=127.0.0.1:{port}", "--", sys.executable, "train.py", "60"),
                            cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        found: dict = {}
        deadline = time.time() + 90
        while time.time() < deadline and "nonfinite-loss" not in found:
            time.sleep(1)
            try:
                text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
            except OSError:
                continue  # not serving yet
            families = {f.name: f for f in text_string_to_metric_families(text)}
            if "trainguard_finding" in families:
                found = {s.labels["name"]: s.labels["step"] for s in families["trainguard_finding"].samples}
        assert found.get("nonfinite-loss") == "10", found
        (state,) = families["trainguard_run_state"].samples
        assert state.labels["state"] == "running"  # scraped while the run lives
        assert families["trainguard_step"].samples[0].value == 40
    finally:
        proc.terminate()
        proc.wait(30)


def test_a_sink_whose_library_is_missing_is_one_line_before_the_run(workdir: Path) -> None:
    # the interpreter told wandb cannot be imported (None in sys.modules), as without the wandb extra
    code = "import sys; sys.modules['wandb'] = None; from trainguard.cli import main; main()"
    out = subprocess.run([sys.executable, "-c", code, "run", "--run-dir", "r", "--sink", "wandb", "--", "true"],
                         cwd=workdir, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip() == "trainguard: error: the wandb sink needs wandb: pip install 'trainguard[wandb]'"
    assert not (workdir / "r").exists()  # refused before anything started


# nanoGPT-style: no trainguard in the script, the loss only printed (every 5 iterations)
PRINTED_SCRIPT = '''
import sys, torch
torch.manual_seed(int(sys.argv[1])); torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
opt = torch.optim.AdamW(model.parameters(), lr=float(sys.argv[2]))
x, y = torch.randn(512, 16), torch.randint(4, (512,))
for it in range(60):
    idx = torch.randint(512, (32,))
    loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
    opt.zero_grad(set_to_none=True); loss.backward(); opt.step()
    if it % 5 == 0 or it == 59:
        print(f"iter {it}: loss {loss.item():.4f}, time 3.1ms", flush=True)
'''


def test_the_printed_loss_of_a_script_without_watch_reaches_report_sinks_and_compare(workdir: Path) -> None:
    import sqlite3

    from prometheus_client.parser import text_string_to_metric_families

    (workdir / "nowatch.py").write_text(PRINTED_SCRIPT)
    for name, seed, lr in (("a", "0", "1e-2"), ("b", "1", "3e-3")):
        out = run_trainguard("run", "--quiet", "--run-dir", name, "--sink", f"prometheus={workdir / name}.prom",
                             "--sink", f"tensorboard={workdir / 'tb'}", "--", sys.executable, "nowatch.py", seed, lr,
                             cwd=workdir, timeout=180)
        assert out.returncode == 0, out.stderr
    printed = [float(line.rsplit("loss ", 1)[1].split(",")[0])
               for line in (workdir / "a" / "output.log").read_text().splitlines() if line.startswith("iter ")]
    assert len(printed) == 13
    printed = printed[1:]  # the log reader leaves out step 0 (a loss before any update), as diagnose does
    with sqlite3.connect(workdir / "a" / "run.db") as conn:
        assert conn.execute("SELECT COUNT(*) FROM steps WHERE loss IS NOT NULL").fetchone() == (0,)  # no probe loss
        kept = [r[0] for r in conn.execute("SELECT loss FROM printed ORDER BY step")]
    assert kept == pytest.approx(printed)

    families = {f.name: f for f in text_string_to_metric_families((workdir / "a.prom").read_text())}
    assert families["trainguard_loss"].samples[0].value == pytest.approx(printed[-1])
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(workdir / "tb" / "a"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("trainguard/loss")] == [*range(5, 60, 5), 59]

    out = run_trainguard("report", "a", cwd=workdir, timeout=120)
    assert out.returncode == 0, out.stderr
    md = (workdir / "a" / "report.md").read_text()
    assert "loss (as printed by the command)" in md and f"{printed[-1]:.4g}" in md, md[:3000]
    assert "Loss and its parts" in (workdir / "a" / "report.html").read_text()

    out = run_trainguard("compare", "a", "b", "--out", "cmp", cwd=workdir, timeout=120)
    assert out.returncode in (0, 1), out.stderr
    loss = json.loads((workdir / "cmp" / "comparison.json").read_text())["convergence"]["loss"]
    assert loss["final_window_steps"][-1] == 59 and loss["a"] == pytest.approx(printed[-1], rel=0.3)
