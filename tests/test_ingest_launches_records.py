"""Launch boundaries, multi-line records and the other reader contracts of issue 30's third fresh corpus.

    pytest -q -p no:xdist tests/test_ingest_launches_records.py

Every fixture is generated here from a writer's format string (named beside it), varied the ways real
files vary (a logging prefix, colour codes, CRLF, a truncated last line, a hole of NUL bytes); none is
copied from a real log or a repository.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from trainguard.errors import UserError
from trainguard.ingest.detect import open_source
from trainguard.ingest.diagnose import diagnose_path
from trainguard.ingest.textlog import read_text_log

pytestmark = pytest.mark.unit


def _loss(step: int) -> float:
    return round(3.0 * math.exp(-step / 40) + 0.5, 4)


def _write(tmp_path: Path, name: str, lines: list[str], end: str = "\n", raw: bytes | None = None) -> Path:
    p = tmp_path / name
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(raw if raw is not None else (end.join(lines) + end).encode())
    return p


def _severe(path: Path) -> list[str]:
    d = diagnose_path(path)
    return [f.name for f in d.findings if f.severity in ("warning", "error")]


def _curve(path: Path) -> list[tuple[int, float]]:
    return [(e["step"], e["loss"]) for e in read_text_log(path).events if e["kind"] == "step"]


# -- a launch boundary: the printed position back at the log's first one -----------------------------------

def _swav(epochs: int, loss: object, prefix: str = "INFO - 09/02/20 14:18:08 - 0:00:30 - ") -> list[str]:
    """SwAV's main_swav.py: the config dump its logger prints first (`epochs: N`), then
    `logger.info("Epoch: [{0}][{1}]\\tTime ... Loss {loss.val:.4f} ({loss.avg:.4f})\\tLr: {lr:.4f}")`."""
    out = [f"{prefix}============ Initialized logger ============", f"{prefix}arch: resnet50",
           "                                     epochs: 40", f"{prefix}============ Starting epoch 0 ... ============"]
    for e in range(epochs):
        for i in range(0, 200, 50):
            value = loss(e, i) if callable(loss) else loss
            out.append(f"{prefix}Epoch: [{e}][{i}]\tTime 1.714 (1.851)\tData 0.000 (0.007)\tLoss {value:.4f} "
                       f"({value:.4f})\tLr: 0.{e + 1:04d}")
    return out


@pytest.mark.parametrize("prefix", ["INFO - 09/02/20 14:18:08 - 0:00:30 - ", "\x1b[32m", ""])
def test_a_relaunch_from_the_first_position_is_judged_on_its_own(tmp_path: Path, prefix: str) -> None:
    # two attempts that collapsed (loss flat at ln(50)), then the launch that trained all its 40 epochs
    flat = _swav(3, 3.9121, prefix) + _swav(1, 3.9122, prefix)
    good = _swav(40, lambda e, i: _loss(e * 4 + i // 50), prefix)
    log = _write(tmp_path, "train.log", flat + good)
    assert _severe(log) == []
    assert diagnose_path(log).state == "completed"
    events = list(read_text_log(log).events)
    assert [e["kind"] for e in events].count("launch") == 2
    # the last launch's rows count from its own start: none is dropped as a step already read
    last = events[max(i for i, e in enumerate(events) if e["kind"] == "launch") + 1:]
    assert [e["step"] for e in last if e["kind"] == "step"] == list(range(1, 161))


def test_a_launch_that_never_trains_leaves_the_verdict_to_the_one_before(tmp_path: Path) -> None:
    good = _swav(40, lambda e, i: _loss(e * 4 + i // 50))
    # a relaunch that prints its config and one row back at the first position, then dies before a second
    crash = _swav(1, 3.9)[:5]
    d = diagnose_path(_write(tmp_path, "train.log", good + crash))
    assert d.steps > 100


def test_a_resumed_run_going_on_from_a_later_position_is_no_new_launch(tmp_path: Path) -> None:
    """A resume from a checkpoint prints its config again and goes on from the epoch it saved: the rules see
    one run (its LR at the resume is compared with the run's own)."""
    first = _swav(20, lambda e, i: _loss(e * 4 + i // 50))
    resumed = [line for line in _swav(40, lambda e, i: _loss(e * 4 + i // 50)) if "Epoch: [" not in line
               or int(line.split("Epoch: [")[1].split("]")[0]) >= 20]
    log = _write(tmp_path, "resumed.log", first + resumed)
    steps = [s for s, _ in _curve(log)]
    assert steps == sorted(steps) and len(steps) == 160


def test_printed_steps_back_at_the_first_one_begin_a_launch(tmp_path: Path) -> None:
    # `step N loss=X` of a script run twice into one file: the first attempt's loss never moved
    flat = [f"step {s} loss=5.0000 lr=0.0001" for s in range(1, 200)]
    good = [f"step {s} loss={_loss(s):.4f} lr=0.0001" for s in range(1, 400)] + ["Training complete"]
    assert _severe(_write(tmp_path, "twice.log", flat + good)) == []


def test_a_csv_written_with_append_over_several_fits_is_judged_on_the_last(tmp_path: Path) -> None:
    """Keras' CSVLogger(append=True): each fit writes `epoch` from 0 again, without a second header."""
    rows = ["epoch,accuracy,learning_rate,loss,val_accuracy,val_loss"]
    for lr, n in ((1e-4, 5), (1e-4, 4), (1e-5, 10), (1e-4, 5)):
        rows += [f"{e},{0.4 + e / 20},{lr},{1.2 - e / 20},{0.5 + e / 30},{1.1 - e / 30}" for e in range(n)]
    path = _write(tmp_path, "training_log.csv", rows)
    kinds = [e["kind"] for e in open_source(path).events]
    assert kinds.count("launch") == 3
    assert _severe(path) == []


# -- a multi-line record: OLMo's console ---------------------------------------------------------------

def _olmo(steps: range, total: int, prefix: str = "2025-12-11 00:30:18.925\thost:0\tolmo.train:979\tINFO\t",
          loss: object = None) -> list[str]:
    """OLMo's Trainer.log_metrics_to_console: f'{prefix}\\n' + '\\n'.join(f'    {name}={format_float(value)}'),
    the prefix f'[step={global_step}/{max_steps},epoch={epoch}]'; format_float writes f'{int(v):,d}' over
    1000, str(v) under 1e-4, 4 significant-ish decimals otherwise."""
    out = []
    for s in steps:
        value = loss(s) if callable(loss) else _loss(s)
        out += [f"{prefix}[step={s}/{total},epoch=0]", "    optim/total_grad_norm=1.234",
                f"    train/CrossEntropyLoss={value:.4f}",
                f"    train/Perplexity={int(math.exp(value)):,d}" if value == value else "    train/Perplexity=nan",
                "    throughput/total_tokens=83,886,080", "    optim/learning_rate_group0=5e-05",
                "    System/Peak GPU Memory (MB)=111,534"]
    return out


@pytest.mark.parametrize("end", ["\n", "\r\n"])
def test_olmo_records_read_as_steps_with_their_plan(tmp_path: Path, end: str) -> None:
    done = _write(tmp_path, "done.log", _olmo(range(1, 101), 100) + ["2025-12-11 01:00:00.000\thost:0\t"
                                                                      "train:377\tINFO\tTraining complete"], end)
    curve = _curve(done)
    assert [s for s, _ in curve] == list(range(1, 101)) and curve[0][1] == _loss(1)
    rows = [e for e in read_text_log(done).events if e["kind"] == "step"]
    assert rows[0]["grad_norm"] == 1.234 and rows[0]["lr"] == 5e-05
    d = diagnose_path(done)
    assert d.state == "completed" and _severe(done) == []  # nine lines a record are one log call, no flood
    # stopped at step 75 of 100, the last record cut mid-line
    cut = _write(tmp_path, "cut.log", [], raw=(end.join(_olmo(range(1, 76), 100)) + end + "    train/Cross").encode())
    d = diagnose_path(cut)
    f = [f for f in d.findings if f.name == "log-ends-unfinished"]
    assert d.state == "unfinished" and f and f[0].severity == "warning" and "75 of 100" in f[0].summary


def test_olmo_nonfinite_loss_in_a_record_is_seen(tmp_path: Path) -> None:
    lines = _olmo(range(1, 41), 100, loss=lambda s: _loss(s) if s < 20 else float("nan"))
    assert "nonfinite-loss" in _severe(_write(tmp_path, "nan.log", lines))


def test_a_wandb_run_folders_output_log_of_olmo_records(tmp_path: Path) -> None:
    run = tmp_path / "wandb" / "run-20251227_005733-abcd1234" / "files"
    _write(run, "output.log", _olmo(range(10, 760, 10), 1000))
    (run / "wandb-metadata.json").write_text(json.dumps({"program": "scripts/train.py"}))
    d = diagnose_path(tmp_path / "wandb" / "run-20251227_005733-abcd1234")
    assert d.steps == 75 and d.state == "unfinished"


# -- a hole of NUL bytes ---------------------------------------------------------------------------------

def test_a_log_with_a_hole_of_nul_bytes_reads_as_text(tmp_path: Path) -> None:
    """`> train.log` under a running job, or a copy taken mid-write: the writer's offset outlives the truncation
    and the file starts with (or holds) a run of NUL bytes."""
    lines = [f"step {s:5d} | loss {_loss(s):.4f} | lr 2.99e-04 | 414 tok/s" for s in range(10, 400, 10)]
    body = ("\r\n".join(lines) + "\r\n").encode()
    head = _write(tmp_path, "head.log", [], raw=b"\x00" * 20000 + body)
    assert len(_curve(head)) == len(lines)
    middle = _write(tmp_path, "middle.log", [], raw=body[:300] + b"\x00" * 74 + body[300:])
    assert len(_curve(middle)) == len(lines)
    crash = _write(tmp_path, "train.err", [], raw=b"Traceback (most recent call last):\n  File \"train.py\", line 3\n"
                   + b"\x00" * 74 + b"RuntimeError: [enforce fail at inline_container.cc:672] . unexpected pos\n")
    assert diagnose_path(crash).state == "crashed"
    # a binary file's NULs are many short runs: still refused
    binary = _write(tmp_path, "model.bin", [], raw=bytes(range(256)) * 64)
    with pytest.raises(UserError):
        read_text_log(binary)


# -- a loss line with no total: the pix2pix/CycleGAN template --------------------------------------------

@pytest.mark.parametrize("rank", ["", "[Rank 0] "])
def test_cyclegan_losses_are_parts_of_their_sum_on_a_samples_axis(tmp_path: Path, rank: str) -> None:
    """util/visualizer.py print_current_losses: '(epoch: %d, iters: %d, time: %.3f, data: %.3f) ' then
    '%s: %.3f ' per loss (newer versions: '[Rank %d] ' first and ', ' between); train.py prints
    'End of epoch %d / %d \\t Time Taken: %d sec'. `iters` counts samples within the epoch."""
    sep = ", " if rank else " "
    lines = []
    for e in range(1, 5):
        for it in range(100, 1001, 100):
            s = (e - 1) * 10 + it // 100
            parts = {"D_A": 0.25, "G_A": _loss(s), "cycle_A": 0.5}
            lines.append(f"{rank}(epoch: {e}, iters: {it}, time: 1.283, data: 0.862) {',' if rank else ''} "
                         + sep.join(f"{k}: {v:.3f}" for k, v in parts.items()))
        lines.append(f"End of epoch {e} / 200 \t Time Taken: 182 sec")
    lines.append("Epoch 5/200:  64%|######4   | 115/180 [01:56<01:05,  1.01s/it]")
    path = _write(tmp_path, "train.log", lines)
    rows = [e for e in read_text_log(path).events if e["kind"] == "step"]
    assert len(rows) == 40 and [r["step"] for r in rows] == sorted(r["step"] for r in rows)
    assert set(rows[0]["parts"]) == {"loss_d_a", "loss_g_a", "loss_cycle_a"}
    assert rows[0]["loss"] == pytest.approx(0.25 + round(_loss(1), 3) + 0.5)
    d = diagnose_path(path)
    f = [f for f in d.findings if f.name == "log-ends-unfinished"]
    assert d.state == "unfinished" and f and "of 200" in f[0].summary


# -- files a framework writes, laid out as its users keep them -------------------------------------------

def test_mmcv_log_json_renamed_and_without_its_meta_record(tmp_path: Path) -> None:
    """mmcv's TextLoggerHook._dump_log: {'mode': 'train', 'epoch': e, 'iter': i within the epoch, 'lr', ...};
    `mode: val` rows after each epoch. Copied without the meta record and named log.json."""
    recs = []
    for e in range(1, 4):
        recs += [{"mode": "train", "epoch": e, "iter": i, "lr": 0.0025, "loss": _loss(e * 10 + i // 10),
                  "time": 0.5} for i in range(1, 101, 10)]
        recs.append({"mode": "val", "epoch": e, "iter": 1601, "lr": 0.0025, "mAP": 0.5 + e / 10})
    path = _write(tmp_path, "log.json", [json.dumps(r) for r in recs])
    src = open_source(path)
    assert src.format == "mmcv log.json"
    steps = [e["step"] for e in src.events if e["kind"] == "step"]
    assert steps == sorted(steps) and len(steps) == 30
    assert _severe(path) == []


def test_a_detectron2_output_folder_reads_its_metrics_json(tmp_path: Path) -> None:
    """detectron2's OUTPUT_DIR: JSONWriter's metrics.json, one object per 20 iterations."""
    rows = [{"iteration": i, "total_loss": _loss(i // 20), "loss_cls": 0.3, "loss_box_reg": 0.2, "lr": 0.00025,
             "time": 0.3, "eta_seconds": (299 - i) * 0.3} for i in range(19, 300, 20)]
    _write(tmp_path / "output", "metrics.json", [json.dumps(r) for r in rows])
    src = open_source(tmp_path / "output")
    assert src.format == "detectron2 metrics.json"


def test_a_command_lines_n_epoch_is_the_plan(tmp_path: Path) -> None:
    lines = ["/usr/bin/python train/train.py --n_epoch=100 --lr=5e-4 --batch_size=128"]
    lines += [f"Epoch {e} |             Train Loss: {_loss(e):.4f} | Token Acc: 0.0660 |             Val Loss: "
              f"{_loss(e) + 0.1:.4f}" for e in range(52)]
    d = diagnose_path(_write(tmp_path, "train.log", lines))
    f = [f for f in d.findings if f.name == "log-ends-unfinished"]
    assert f and f[0].severity == "warning" and "of 100" in f[0].summary


def _ultralytics_events(folder: Path, epochs: range, per_batch: int = 3) -> None:
    """Ultralytics' TensorBoard callback: `train/*_loss` per batch and `metrics/*`, `val/*` per epoch, all at
    the epoch as the step (callbacks/tensorboard.py `_log_scalars(..., trainer.epoch + 1)`)."""
    from torch.utils.tensorboard import SummaryWriter

    w = SummaryWriter(str(folder))
    for e in epochs:
        for b in range(per_batch):
            w.add_scalar("train/box_loss", 1.5 - e / 100 - b / 1000, e)
            w.add_scalar("train/cls_loss", 2.0 - e / 50, e)
        w.add_scalar("metrics/mAP50(B)", 0.1 + e / 200, e)
        w.add_scalar("metrics/mAP50-95(B)", 0.05 + e / 400, e)
        w.add_scalar("val/box_loss", 1.4 - e / 200, e)
    w.close()


def test_tensorboard_files_beside_an_ultralytics_plan_read_as_its_epochs(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    done, cut = tmp_path / "train", tmp_path / "train2"
    _ultralytics_events(done, range(1, 31))
    (done / "args.yaml").write_text("task: detect\nepochs: 30\npatience: 100\n")
    d = diagnose_path(done)
    assert d.state == "completed" and d.steps == 30 and _severe(done) == []
    _ultralytics_events(cut, range(1, 8))
    (cut / "args.yaml").write_text("task: detect\nepochs: 30\npatience: 100\n")
    d = diagnose_path(cut)
    assert d.state == "unfinished" and "log-ends-unfinished" in _severe(cut)


def test_llmc_log_files_hellaswag_line_is_an_evaluation_at_its_own_step(tmp_path: Path) -> None:
    """llm.c's Logger: `s:%d tel:%.4f` (val loss) and, with HellaSwag on, `s:%d eval:%.4f` at the same step,
    both before that step's `s:%d trl:...`; the loop ends with an evaluation at step N (no train step N)."""
    lines = []
    for s in range(0, 1001):
        if s % 250 == 0:
            lines += [f"s:{s} tel:{_loss(s // 10) + 0.1:.4f}", f"s:{s} eval:{0.25 + s / 10000:.4f}"]
        lines.append(f"s:{s} trl:{_loss(s // 10):.4f} lr:0.000600 norm:0.25")
    lines += ["s:1001 tel:0.6000", "s:1001 eval:0.3500"]
    d = diagnose_path(_write(tmp_path, "main.log", lines))
    assert d.state == "completed"


@pytest.mark.parametrize("prefix", ["", "2024-04-30 10:00:00.123 | INFO     | autotrain.trainers.common:on_log:226 - ",
                                    "INFO:root:", "\x1b[32m2024-04-30 10:00:00,123 - __main__ - INFO - "])
def test_the_trainers_logs_dict_behind_a_logging_prefix(tmp_path: Path, prefix: str) -> None:
    """transformers' Trainer.log: `{'loss': .., 'grad_norm': .., 'learning_rate': .., 'epoch': ..}` per logging
    step, `{'eval_loss': ..}` per evaluation, `{'train_runtime': ..}` at the end; printed bare by its progress
    callback, or as a logger's message (AutoTrain's loguru `on_log`, a script's `logger.info(logs)`)."""
    lines = []
    for s in range(1, 61):
        lines.append(prefix + str({"loss": _loss(s), "grad_norm": 1.2, "learning_rate": 5e-05, "epoch": s / 60}))
        if s % 20 == 0:
            lines.append(prefix + str({"eval_loss": _loss(s) + 0.1, "eval_runtime": 3.2, "epoch": s / 60}))
    lines.append(prefix + str({"train_runtime": 120.5, "train_loss": 1.1, "epoch": 1.0}))
    path = _write(tmp_path, "train.log", lines)
    curve = _curve(path)
    assert len(curve) == 60 and curve[0][1] == _loss(1) and curve[-1][1] == _loss(60)
    assert read_text_log(path) and diagnose_path(path).evals == 3


def test_a_config_printed_as_a_repr_one_field_a_line_is_no_evaluation(tmp_path: Path) -> None:
    """nerfstudio/tyro print the config dataclass pretty, one `name=value,` a line; its `eval_*` fields are
    settings (`eval_num_rays_per_batch=4096,`), and the run below crashed before any step."""
    lines = ["Difix3DTrainerConfig(", "    steps_per_eval_batch=500,", "    pipeline=PipelineConfig(",
             "        datamanager=DataManagerConfig(", "            eval_num_rays_per_batch=4096,",
             "            eval_num_images_to_sample_from=-1,", "        ),", "    ),", ")",
             "Traceback (most recent call last):", '  File "train.py", line 9, in <module>',
             "RuntimeError: CUDA error: device-side assert triggered"]
    d = diagnose_path(_write(tmp_path, "train.log", lines))
    assert d.evals == 0 and d.state == "crashed"


def test_a_step_counter_restarting_under_each_epochs_heading_is_no_relaunch(tmp_path: Path) -> None:
    # `print(f"Epoch {e}/{n}")` then `print(f"iter {i} loss={loss}")`, the counter restarting each epoch
    lines = []
    for e in range(1, 6):
        lines.append(f"Epoch {e}/5")
        lines += [f"iter {i} loss={_loss(e * 10 + i // 10):.4f}" for i in range(0, 100, 10)]
    events = list(read_text_log(_write(tmp_path, "train.log", lines)).events)
    assert [e["kind"] for e in events].count("launch") == 0


def test_a_tables_step_counted_within_its_epoch_is_no_relaunch(tmp_path: Path) -> None:
    rows = ["epoch,step,loss,lr"] + [f"{e},{s},{_loss(e * 10 + s)},0.001" for e in range(4) for s in range(10)]
    kinds = [e["kind"] for e in open_source(_write(tmp_path, "metrics.csv", rows)).events]
    assert kinds.count("launch") == 0


def test_a_lone_ultralytics_event_file_reads_its_loss_parts_as_steps(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    _ultralytics_events(tmp_path / "tb", range(1, 21))
    d = diagnose_path(next((tmp_path / "tb").glob("events.out.tfevents.*")))
    assert d.steps == 20 and d.evals == 20


def test_a_line_glued_after_a_bar_of_unknown_total_is_its_own_line(tmp_path: Path) -> None:
    """Lightning's validation bar before its first batch knows no total (`0/?`); a logger's line printed while
    it is drawn lands after it, behind tqdm's cursor-up code."""
    bar = "\rValidation: |          | 0/? [00:00<?, ?it/s]\x1b[A"
    lines = [f"{bar}[\x1b[37m12/09/24 14:03:31\x1b[0m] \x1b[34mINFO\x1b[0m   Epoch {e}: v_recons 4.545e-01  "
             f"loss {_loss(e):.3e}  kl 5.591e+00" for e in range(30)]
    curve = _curve(_write(tmp_path, "train.out", lines))
    assert len(curve) == 30 and curve[0][1] == float(f"{_loss(0):.3e}")


def test_lightnings_epoch_bars_kept_at_their_last_redraw_are_steps_of_the_run(tmp_path: Path) -> None:
    """Lightning's TQDMProgressBar describes its training bar `Epoch {current_epoch}`; a saved output (W&B's
    output.log, `> out.txt`) often keeps only each epoch's last redraw, the count always at its total."""
    lines = [f"Epoch {e}: 100%|##########| 352/352 [00:24<00:00, 14.09it/s, v_num=gbej, "
             f"train/loss_total_step={_loss(e):.3f}, val/accuracy=0.{60 + e}]" for e in range(15)]
    curve = _curve(_write(tmp_path, "output.log", lines))
    assert [s for s, _ in curve] == [352 * (e + 1) for e in range(15)]


def test_a_lightning_table_whose_loss_is_logged_per_epoch_only(tmp_path: Path) -> None:
    """Lightning's CSVLogger with `self.log("train_loss", loss, on_step=False, on_epoch=True)`: the loss is
    written once per epoch as `train_loss_epoch`, on the row of the epoch's last step; validation rows between."""
    rows = ["epoch,step,train_acc_epoch,train_loss_epoch,val_acc,val_loss"]
    for e in range(30):
        step = (e + 1) * 10 - 1
        rows.append(f"{e},{step},,,{0.5 + e / 100},{_loss(e) + 0.1}")
        rows.append(f"{e},{step},{0.4 + e / 100},{_loss(e)},,")
    version = tmp_path / "lightning_logs" / "version_0"
    _write(version, "metrics.csv", rows)
    d = diagnose_path(tmp_path)
    # (no hparams.yaml plan and no test rows: whether the 30th epoch was the last is not in the file)
    assert d.steps == 30 and d.evals == 30 and d.state == "unknown"


def test_an_earlier_launchs_crash_is_not_the_ending_of_a_later_launch_that_trains(tmp_path: Path) -> None:
    crashed = [f"step {s} loss={_loss(s):.4f} lr=0.0001" for s in range(1, 300)]
    crashed += ["Traceback (most recent call last):", '  File "train.py", line 40, in <module>',
                "RuntimeError: CUDA error: an illegal memory access was encountered"]
    again = [f"step {s} loss={_loss(s):.4f} lr=0.0001" for s in range(1, 400)] + ["Training complete"]
    d = diagnose_path(_write(tmp_path, "train.log", crashed + again))
    assert d.state == "completed" and _severe(tmp_path / "train.log") == []
    # the crash stays the ending when no launch trains after it
    d = diagnose_path(_write(tmp_path, "crash.log", again[:-1] + crashed[-3:]))
    assert d.state == "crashed"
    # and a relaunch that dies before training leaves the crash of the run before it... and its own
    prompt = ["me@box:~$ python infer.py", "Traceback (most recent call last):", '  File "infer.py", line 2',
              "ModuleNotFoundError: No module named 'foo'"]
    d = diagnose_path(_write(tmp_path, "both.log", crashed + prompt))
    assert d.state == "crashed"


# -- argparse's refusal, then the command run again into the same file ---------------------------------

_USAGE = ["usage: train.py [-h] [--weights WEIGHTS] [--name NAME]",
          "train.py: error: argument --name: expected one argument"]


def test_a_refused_command_line_followed_by_pages_of_a_later_launch_is_not_how_the_run_ended(tmp_path: Path) -> None:
    # argparse exits 2 at its error line (Lib/argparse.py ArgumentParser.error): what follows is another launch
    later = [f"iter {i}: loss {4.0 - i * 0.01:.4f}, time 10.00ms, mfu 30.00%" for i in range(60)]
    d = diagnose_path(_write(tmp_path, "nohup.out", _USAGE + later))
    assert d.state != "launch-failed" and d.steps >= 59  # (iter 0 is the position before the first step)
    assert not [f for f in d.findings if f.severity == "error"]


def test_a_refused_command_line_that_ends_the_log_is_a_failed_launch(tmp_path: Path) -> None:
    # a wrapper's few lines after it (job control, an epilogue) do not make it another launch
    d = diagnose_path(_write(tmp_path, "nohup.out", _USAGE + ["[1]+  Exit 2   python train.py --name", "done"]))
    assert d.state == "launch-failed"
