"""`diagnose` on what real run folders hold (issue 30): several runs in one folder, a YOLO run that never
finished an epoch, the scheduler's output files beside the metrics, YOLOv7's results.txt, an LR printed as a
list, a log that begins late in its plan, and one rule's escalation told once.

Every fixture is written here from its writer's contract: TensorBoard's own `EventFileWriter`, Ultralytics'
`args.yaml`/`results.csv`, YOLOv7's `results.txt` row format, HRNet-seg's printed line, Slurm's `slurmstepd`
lines. Each failing case has a healthy twin that must stay quiet.

Run: pytest -p no:xdist tests/test_diagnose_folders.py
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainguard.errors import UserError
from trainguard.ingest import runs
from trainguard.ingest.diagnose import diagnose_path

pytestmark = pytest.mark.unit

TIME_LIMIT = "slurmstepd: error: *** JOB 4242 ON gpu12 CANCELLED AT 2024-03-01T10:00:00 DUE TO TIME LIMIT ***\n"
OOM_KILL = ("slurmstepd: error: Detected 1 oom_kill event in StepId=4242.batch. Some of the step tasks have been "
            "OOM Killed.\n")


def codes(d) -> list[str]:
    return [f.code for f in d.findings]


def severe(d) -> list[str]:
    return [f.code for f in d.findings if f.severity in ("warning", "error")]


# -- writers, from each format's contract ----------------------------------------------------------------

def tb_run(folder: Path, losses: list[float], tag: str = "train/loss", start: int = 0) -> None:
    """One writer's event file, as torch's and Lightning's SummaryWriter write it (TensorBoard's own writer)."""
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    folder.mkdir(parents=True, exist_ok=True)
    w = EventFileWriter(str(folder))
    for i, v in enumerate(losses):
        w.add_event(Event(step=start + i, wall_time=1.7e9 + i,
                          summary=Summary(value=[Summary.Value(tag=tag, simple_value=v)])))
    w.close()


def falling(n: int) -> list[float]:
    return [2.0 * math.exp(-i / 40) + 0.1 + 0.01 * math.sin(i) for i in range(n)]


def ultralytics_run(folder: Path, epochs: int, done: int, args: bool = True) -> Path:
    """Ultralytics' run folder: args.yaml and weights/ at start, a results.csv row per finished epoch."""
    (folder / "weights").mkdir(parents=True, exist_ok=True)
    if args:
        (folder / "args.yaml").write_text(f"task: detect\nmode: train\nmodel: yolov8n.pt\nepochs: {epochs}\n"
                                          "patience: 100\nbatch: 16\nimgsz: 640\nplots: true\n")
    if done:
        head = ("epoch,train/box_loss,train/cls_loss,train/dfl_loss,metrics/precision(B),metrics/recall(B),"
                "metrics/mAP50(B),metrics/mAP50-95(B),val/box_loss,val/cls_loss,val/dfl_loss,lr/pg0,lr/pg1,lr/pg2")
        rows = []
        for e in range(1, done + 1):
            f = 1 - math.exp(-e / 10)
            lr = 0.01 * (1 - 0.99 * (e - 1) / epochs)
            rows.append(",".join(f"{x:.5g}" for x in (e, 1.5 - f, 2.0 - 1.2 * f, 1.3 - 0.3 * f, 0.5 + 0.3 * f,
                                                         0.4 + 0.3 * f, 0.6 * f, 0.4 * f, 1.4 - 0.3 * f, 1.9 - f,
                                                         1.2 - 0.2 * f, lr, lr, lr)))
        (folder / "results.csv").write_text(head + "\n" + "\n".join(rows) + "\n")
        (folder / "weights" / "last.pt").write_bytes(b"PK")
    return folder


def trainer_state(folder: Path, last: int, max_steps: int, closing: bool = False) -> Path:
    """A Hugging Face output_dir's trainer_state.json (log_history rows every 10 steps; the closing summary)."""
    folder.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = [{"step": s, "epoch": s / 100, "loss": 3.0 * math.exp(-s / 300) + 0.5,
                         "learning_rate": 5e-5 * (1 - s / max_steps), "grad_norm": 1.0} for s in range(10, last + 1, 10)]
    if closing:
        rows.append({"step": last, "epoch": last / 100, "train_runtime": 1234.5, "train_loss": 1.1})
    (folder / "trainer_state.json").write_text(json.dumps(
        {"global_step": last, "max_steps": max_steps, "num_train_epochs": max_steps // 100, "logging_steps": 10,
         "log_history": rows}))
    return folder


def yolov7_results(folder: Path, epochs: int, last: int, *, notest: bool = False) -> Path:
    """YOLOv7's train.py: opt.yaml and hyp.yaml first, then per epoch `s + '%10.4g' * 7 % results`."""
    (folder / "weights").mkdir(parents=True, exist_ok=True)
    (folder / "opt.yaml").write_text(f"weights: yolov7.pt\nepochs: {epochs}\nbatch_size: 16\nnotest: {str(notest).lower()}\n")
    (folder / "hyp.yaml").write_text("lr0: 0.01\nlrf: 0.1\n")
    lines = []
    for e in range(last + 1):
        box, obj, cls = 0.06 * math.exp(-e / 30) + 0.02, 0.03 * math.exp(-e / 40) + 0.01, 0.02 * math.exp(-e / 20)
        s = ("%10s" * 2 + "%10.4g" * 6) % (f"{e}/{epochs - 1}", "7.31G", box, obj, cls, box + obj + cls, 37, 640)
        m = 0.6 * (1 - math.exp(-e / 25))
        results = (0,) * 7 if notest and e + 1 != epochs else (0.5 + m / 3, 0.4 + m / 3, m, 0.6 * m, box, obj, cls)
        lines.append(s + "%10.4g" * 7 % results)
    (folder / "results.txt").write_text("\n".join(lines) + "\n")
    return folder


# -- 1. a folder of several runs -------------------------------------------------------------------------

def test_a_folder_of_two_tensorboard_runs_is_two_runs_worst_first(tmp_path: Path) -> None:
    tb_run(tmp_path / "runs" / "exp1", falling(200))
    bad = falling(200)
    bad[120:] = [float("nan")] * 80
    tb_run(tmp_path / "runs" / "exp2", bad)
    found = runs.run_folders(tmp_path / "runs")
    assert [p.name for p in found] == ["exp1", "exp2"]
    results = runs.diagnose_runs(tmp_path / "runs", found)
    assert [Path(d.path).parent.name for d in results] == ["exp2", "exp1"]  # the one with an error first
    assert "TG301" in codes(results[0]) and severe(results[1]) == []
    doc = runs.to_dict(tmp_path / "runs", results)
    assert doc["format"] == "several runs" and len(doc["runs"]) == 2


def test_event_files_of_one_folder_are_one_run_as_tensorboard_reads_them(tmp_path: Path) -> None:
    # a restart writes a second event file into the same folder: TensorBoard's DirectoryWatcher reads the
    # folder's files as one run, and so does diagnose
    tb_run(tmp_path / "run", falling(100))
    _started_earlier(tmp_path / "run")
    tb_run(tmp_path / "run", falling(200)[100:], start=100)
    assert len(list((tmp_path / "run").glob("events.out.tfevents.*"))) == 2
    assert runs.run_folders(tmp_path / "run") == []
    assert diagnose_path(tmp_path / "run").steps == 200


def test_a_writer_reopened_on_the_same_folder_is_judged_from_its_restart(tmp_path: Path) -> None:
    # the same script run again into the same log dir: a second file whose tags start over. TensorBoard's
    # loader lets the new steps replace the old ones; diagnose judges the run from that launch on
    bad = falling(200)
    bad[120:] = [float("nan")] * 80
    tb_run(tmp_path / "run", bad)
    _started_earlier(tmp_path / "run")
    tb_run(tmp_path / "run", falling(200))
    d = diagnose_path(tmp_path / "run")
    assert "TG301" not in codes(d) and severe(d) == []
    # its twin: the failing run last is the one judged
    tb_run(tmp_path / "again", falling(200))
    _started_earlier(tmp_path / "again")
    tb_run(tmp_path / "again", bad)
    assert "TG301" in codes(diagnose_path(tmp_path / "again"))


def _started_earlier(folder: Path) -> None:
    """The event file a writer left, renamed as if written 100 s before the next: two launches are seconds
    apart at least, and one process's two writers in the same second are ordered by a counter that sorts
    as text (`.9` after `.10`), which made this test flaky."""
    for f in folder.glob("events.out.tfevents.*"):
        parts = f.name.split(".")
        parts[3] = f"{int(parts[3]) - 100:010d}"
        f.rename(f.with_name(".".join(parts)))


def test_keras_train_and_validation_writers_are_one_fit(tmp_path: Path) -> None:
    fit = tmp_path / "logs" / "fit" / "20240101-120000"
    tb_run(fit / "train", falling(50), tag="epoch_loss")
    tb_run(fit / "validation", falling(50), tag="epoch_val_loss")
    assert runs.run_folders(tmp_path / "logs") == []
    # two fits, each with its two writers: two runs
    tb_run(tmp_path / "logs" / "fit" / "20240102-080000" / "train", falling(50), tag="epoch_loss")
    tb_run(tmp_path / "logs" / "fit" / "20240102-080000" / "validation", falling(50), tag="epoch_val_loss")
    assert [p.name for p in runs.run_folders(tmp_path / "logs" / "fit")] == ["20240101-120000", "20240102-080000"]


def test_lightning_versions_are_runs_and_one_version_is_one(tmp_path: Path) -> None:
    for v in (0, 1, 2):
        tb_run(tmp_path / "lightning_logs" / f"version_{v}", falling(60))
    assert [p.name for p in runs.run_folders(tmp_path)] == ["version_0", "version_1", "version_2"]
    assert runs.run_folders(tmp_path / "lightning_logs" / "version_2") == []


def test_ultralytics_runs_folder_holds_a_run_per_name(tmp_path: Path) -> None:
    ultralytics_run(tmp_path / "detect" / "train", 20, 20)
    ultralytics_run(tmp_path / "detect" / "train2", 20, 7)
    tb_run(tmp_path / "detect" / "train2", falling(7))  # its TensorBoard file is inside the run, not a run
    found = runs.run_folders(tmp_path / "detect")
    assert [p.name for p in found] == ["train", "train2"]
    states = [d.state for d in runs.diagnose_runs(tmp_path / "detect", found)]
    assert states == ["unfinished", "completed"]
    assert runs.run_folders(tmp_path / "detect" / "train2") == []  # the run folder itself: one run


# -- 2. a YOLO run that never finished an epoch ----------------------------------------------------------

def test_ultralytics_folder_with_only_args_yaml_never_finished_an_epoch(tmp_path: Path) -> None:
    run = ultralytics_run(tmp_path / "train", 100, 0)
    d = diagnose_path(run)
    assert d.state == "unfinished" and codes(d) == ["TG531"]
    f = d.findings[0]
    assert f.cause == "no-epoch" and f.evidence["planned_epochs"] == 100 and "never finished an epoch" in f.summary
    (run / "weights").rmdir()  # a folder without weights/ reads the same
    assert diagnose_path(run).state == "unfinished"


def test_ultralytics_folder_whose_weights_show_an_epoch_ended_is_refused(tmp_path: Path) -> None:
    run = ultralytics_run(tmp_path / "train", 100, 0)
    (run / "weights" / "last.pt").write_bytes(b"PK")
    with pytest.raises(UserError, match="last.pt shows an epoch ended"):
        diagnose_path(run)


def test_ultralytics_twin_with_its_results_csv_is_read_as_before(tmp_path: Path) -> None:
    d = diagnose_path(ultralytics_run(tmp_path / "train", 30, 30))
    assert d.state == "completed" and severe(d) == []


# -- 3. the scheduler's output files beside the metrics --------------------------------------------------

def test_slurm_time_limit_beside_trainer_state_decides_the_ending(tmp_path: Path) -> None:
    run = trainer_state(tmp_path / "out", 400, 1000)
    before = diagnose_path(run)
    assert before.state == "unfinished"
    (run / "slurm-4242.out").write_text("{'loss': 1.2, 'learning_rate': 3e-05, 'epoch': 4.0}\n" + TIME_LIMIT)
    d = diagnose_path(run)
    assert d.state == "cut-off" and "TG503" in codes(d) and "TG531" not in codes(d)
    assert "slurm-4242.out" in next(f.summary for f in d.findings if f.code == "TG503")


def test_slurm_output_without_a_failure_changes_nothing(tmp_path: Path) -> None:
    run = trainer_state(tmp_path / "out", 400, 1000)
    (run / "slurm-4242.out").write_text("Loading modules\n{'loss': 1.2, 'learning_rate': 3e-05, 'epoch': 4.0}\n")
    (run / "slurm-4242.err").write_text("")
    d = diagnose_path(run)
    assert d.state == "unfinished" and "TG503" not in codes(d) and "TG501" not in codes(d)


def test_oom_kill_beside_tensorboard_files_is_a_kill(tmp_path: Path) -> None:
    tb_run(tmp_path / "run", falling(150))
    (tmp_path / "run" / "job.err").write_text(OOM_KILL)
    d = diagnose_path(tmp_path / "run")
    assert d.state == "killed" and "TG503" in codes(d)


def test_traceback_beside_a_completed_run_is_said_but_the_training_completed(tmp_path: Path) -> None:
    run = trainer_state(tmp_path / "out", 1000, 1000, closing=True)
    (run / "train.err").write_text('Traceback (most recent call last):\n  File "push.py", line 3, in <module>\n'
                                   "    upload()\nConnectionError: hub unreachable\n")
    d = diagnose_path(run)
    assert d.state == "completed"
    crash = next(f for f in d.findings if f.code == "TG501")
    assert crash.severity == "warning" and crash.summary.startswith("after the training completed")


def test_scheduler_cut_before_the_first_epoch_of_a_yolo_run(tmp_path: Path) -> None:
    run = ultralytics_run(tmp_path / "train", 100, 0)
    (run / "slurm-7.out").write_text("Ultralytics 8.1.0 Python-3.10 torch-2.1.0 CUDA:0\n" + TIME_LIMIT)
    d = diagnose_path(run)
    assert d.state == "cut-off" and codes(d) == ["TG503"]


def test_a_folder_of_only_the_schedulers_files_reads_its_out_as_the_log(tmp_path: Path) -> None:
    job = tmp_path / "job"
    job.mkdir()
    (job / "slurm-55.out").write_text("".join(f"step {s} loss={2.0 - s / 100:.3f}\n" for s in range(1, 40)))
    (job / "slurm-55.err").write_text(TIME_LIMIT)
    d = diagnose_path(job)
    assert d.path.name == "slurm-55.out" and d.state == "cut-off" and "TG503" in codes(d)
    (job / "slurm-55.err").write_text("")  # its twin: nothing in the .err, the .out alone says it stops
    assert diagnose_path(job).state == "unfinished"


# -- 4. YOLOv7's results.txt -----------------------------------------------------------------------------

def test_yolov7_results_txt_completed_at_its_last_planned_epoch(tmp_path: Path) -> None:
    d = diagnose_path(yolov7_results(tmp_path / "exp", 30, 29))
    assert d.format == "yolov7 results.txt" and d.state == "completed" and severe(d) == []
    assert d.steps == 30 and d.evals == 30


def test_yolov7_results_txt_cut_off_states_its_plan_from_the_rows(tmp_path: Path) -> None:
    run = yolov7_results(tmp_path / "exp", 300, 41)
    (run / "opt.yaml").write_text("epochs: 999\n")  # the rows' own `/N` wins (fine-tuning adds epochs to it)
    d = diagnose_path(run)
    assert d.state == "unfinished" and "TG531" in codes(d)
    assert "42 of the 300 epochs" in next(f.summary for f in d.findings if f.code == "TG531")


def test_yolov7_notest_epochs_are_not_evaluations(tmp_path: Path) -> None:
    # `--notest`: every epoch but the last writes its initial zeros; frozen zeros are no frozen metrics
    d = diagnose_path(yolov7_results(tmp_path / "exp", 30, 29, notest=True))
    assert d.state == "completed" and d.evals == 1 and severe(d) == []


def test_a_results_txt_that_is_no_yolo_table_is_read_as_a_log(tmp_path: Path) -> None:
    p = tmp_path / "results.txt"
    p.write_text("".join(f"step {s} loss={2.0 - s / 100:.3f}\n" for s in range(1, 60)) + "Training complete\n")
    d = diagnose_path(p)
    assert d.format == "text log" and d.state == "completed"


def yolov7_console(path: Path, epochs: int, last: int, *, end: str = "done", batches: int = 40) -> Path:
    """YOLOv7's train.py console: the header each epoch, the bar redrawn with the row as its description
    (carriage returns), test.py's header bar and its `all` row, 'N epochs completed in H hours.' at the end."""
    text = f"Namespace(adam=False, batch_size=16, epochs={epochs}, img_size=[640, 640], notest=False)\n"
    for e in range(last + 1):
        text += "\n" + ("%10s" * 8) % ("Epoch", "gpu_mem", "box", "obj", "cls", "total", "labels", "img_size") + "\n"
        mean = [0.0, 0.0, 0.0]
        for i in range(batches):
            g = e * batches + i
            now = (0.06 * math.exp(-g / 300) + 0.02, 0.03 * math.exp(-g / 400) + 0.01, 0.02 * math.exp(-g / 200))
            mean = [(m * i + x) / (i + 1) for m, x in zip(mean, now, strict=True)]
            row = ("%10s" * 2 + "%10.4g" * 6) % (f"{e}/{epochs - 1}", "7.31G", *mean, sum(mean), 37, 640)
            text += f"\r{row}: {100 * (i + 1) // batches:3d}%|#####     | {i + 1}/{batches} [00:10<00:10,  3.9it/s]"
        text += "\n" + ("%20s" + "%12s" * 6) % ("Class", "Images", "Labels", "P", "R", "mAP@.5", "mAP@.5:.95")
        m = 0.6 * (1 - math.exp(-e / 25))
        text += ": 100%|#####| 8/8 [00:02<00:00,  3.1it/s]\n"
        text += ("%20s" + "%12i" * 2 + "%12.3g" * 4) % ("all", 128, 929, 0.5 + m / 3, 0.4 + m / 3, m, 0.6 * m) + "\n"
    if end == "done":
        text += f"{last + 1} epochs completed in 1.234 hours.\n"
    elif end == "oom":
        text += ('Traceback (most recent call last):\n  File "train.py", line 612, in <module>\n'
                 "    train(hyp, opt, device, tb_writer)\nRuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB\n")
    path.write_text(text)
    return path


def test_yolov7_console_rows_are_read_under_their_header(tmp_path: Path) -> None:
    done = diagnose_path(yolov7_console(tmp_path / "done.log", 10, 9))
    assert done.state == "completed" and done.steps == 400 and done.evals == 10 and severe(done) == []
    assert not any(need in ("parts", "eval") for _, need in done.not_run)
    cut = diagnose_path(yolov7_console(tmp_path / "cut.log", 300, 12, end=""))
    assert cut.state == "unfinished" and "of 12,000 (4.3%)" in next(f.summary for f in cut.findings if f.code == "TG531")
    oom = diagnose_path(yolov7_console(tmp_path / "oom.log", 300, 12, end="oom"))
    assert oom.state == "crashed" and "TG501" in codes(oom)


# -- 5. an LR printed as a list, and a log that begins late in its plan ----------------------------------

def test_an_lr_printed_as_a_list_is_the_first_groups_lr() -> None:
    from trainguard.ingest.textlines import _pairs

    assert _pairs("Epoch: [0/484] Iter:[10/371], Time: 2.45, lr: [0.00999], Loss: 2.893")["lr"] == 0.00999
    assert _pairs("iter 20 Lr: [0.01, 0.001] loss: 1.2")["lr"] == 0.01
    assert _pairs("[Rank 0] step=10, skipped=0, lr=[0.0001], mom=[(0.9, 0.999)]")["lr"] == 0.0001
    assert "lr" not in _pairs("sizes: [0.5, 0.25] loss: 1.0")  # a list of something else is no LR


def hrnet_log(path: Path, first_epoch: int, *, flat: bool, epochs: int = 484, iters: int = 371, seen: int = 6) -> Path:
    """HRNet-seg's lib/core/function.py train(): 'Epoch: [e/N] Iter:[i/n], Time: t, lr: [..], Loss: x'
    every PRINT_FREQ iterations, epochs 0-based, the loss a running mean over the epoch, the LR poly-decayed."""
    total, lines = epochs * iters, ["=> creating output/cityscapes/seg_hrnet"]
    for e in range(first_epoch, first_epoch + seen):
        for i in range(0, iters, 10):
            g = e * iters + i
            lr = 0.01 * (1 - g / total) ** 0.9
            loss = 0.3 if flat else 0.3 + 2.5 * max(0.0, 1 - g / (4 * iters))
            loss += 0.01 * math.sin(7 * g)
            lines.append(f"2024-01-01 10:00:00,000 Epoch: [{e}/{epochs}] Iter:[{i}/{iters}], Time: 0.52, "
                         f"lr: [{lr:.8f}, {lr:.8f}], Loss: {loss:.6f}")
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_resumed_log_deep_in_its_plan_is_not_called_not_learning(tmp_path: Path) -> None:
    late = diagnose_path(hrnet_log(tmp_path / "late.log", 300, flat=True))
    assert "TG204" not in codes(late)
    stop = next(f for f in late.findings if f.code == "TG531")
    assert "of 179,564 (63.0%)" in stop.summary  # where in the whole plan, not in the part the log holds
    # the twin: the same flat loss from the plan's start is a run that does not learn
    start = diagnose_path(hrnet_log(tmp_path / "start.log", 0, flat=True))
    assert "TG204" in codes(start)
    # and a run that learns from its start stays quiet, its LR read from the list
    ok = diagnose_path(hrnet_log(tmp_path / "ok.log", 0, flat=False))
    assert "TG204" not in codes(ok) and not any(r.startswith("lr-") for r, need in ok.not_run if need == "lr")


def test_a_global_step_log_that_begins_late_in_its_plan(tmp_path: Path) -> None:
    def log(name: str, first: int) -> Path:
        p = tmp_path / name
        p.write_text("".join(f"step {s}/50000 loss={1.2 + 0.01 * math.sin(s):.4f} lr=0.0001\n"
                             for s in range(first, first + 3000, 10)))
        return p

    assert "TG204" not in codes(diagnose_path(log("late.log", 30000)))
    assert "TG204" in codes(diagnose_path(log("start.log", 10)))


# -- 6. a rule's warning and its escalation are one finding ----------------------------------------------

def test_nonfinite_loss_escalation_is_one_finding(tmp_path: Path) -> None:
    bad = falling(200)
    bad[120:] = [float("nan")] * 80
    tb_run(tmp_path / "run", bad)
    d = diagnose_path(tmp_path / "run")
    tg301 = [f for f in d.findings if f.code == "TG301"]
    assert len(tg301) == 1 and tg301[0].severity == "error"
    assert tg301[0].evidence["earlier"][0]["severity"] == "warning"
    assert json.dumps(d.to_dict(), default=str).count('"TG301"') == 1


# -- damaged input: one line, never a traceback -----------------------------------------------------------

@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_damaged_yolov7_files_read_or_refuse_in_one_line(tmp_path: Path, data: st.DataObject) -> None:
    run = yolov7_results(tmp_path / "exp", 30, 12)
    console = yolov7_console(tmp_path / "console.log", 30, 2, batches=5)
    for path in (run / "results.txt", console):
        raw = bytearray(path.read_bytes())
        for _ in range(data.draw(st.integers(1, 8))):
            at = data.draw(st.integers(0, len(raw) - 1))
            raw[at:at + data.draw(st.integers(0, 12))] = data.draw(st.binary(max_size=12))
        path.write_bytes(bytes(raw))
        try:
            diagnose_path(path)
            diagnose_path(run)
        except UserError:
            pass
