"""The structured formats `diagnose` reads, each generated here from its contract (`trainguard.ingest.formats`).

Every fixture is written by the test from what the format's writer promises (its columns, step axis, plan
file, completion signal, parts meaning), in the variants real runs leave: complete, cut off, early
stopped, resumed, a truncated last row, CRLF line ends, extra columns, empty cells, a checkpoint's
snapshot. No file of any real run is used. The format table in docs/formats.md is rendered from the
registry and must match it.

Run: pytest tests/test_formats.py
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from trainguard.errors import UserError
from trainguard.ingest.diagnose import diagnose_path
from trainguard.ingest.formats import all_formats, render_markdown

pytestmark = pytest.mark.unit

DOCS = Path(__file__).resolve().parents[1] / "docs" / "formats.md"


def severe(d) -> list[str]:
    return [f.name for f in d.findings if f.severity in ("warning", "error")]


def tg531(d):
    return next((f for f in d.findings if f.name == "log-ends-unfinished"), None)


# -- the registry ---------------------------------------------------------------------------------------

def test_every_contract_says_what_is_read() -> None:
    contracts = all_formats()
    assert len({c.name for c in contracts}) == len(contracts) >= 12
    for c in contracts:
        assert c.writer and c.files and c.metrics and c.step_axis and c.plan and c.completion, c.name
        assert c.parts in ("sum", "weighted-sum", "median", "independent", "none"), c.name
        assert not c.plan_keys or c.plan_files or c.name.endswith(("json", "jsonl")), c.name


def test_every_family_module_is_loaded() -> None:
    import sys

    import trainguard.ingest.formats as package

    all_formats()
    folder = Path(package.__file__).parent
    modules = {p.stem for p in folder.glob("*.py") if p.stem != "__init__"}
    assert modules and all(f"trainguard.ingest.formats.{m}" in sys.modules for m in modules)


def test_docs_formats_md_is_rendered_from_the_registry() -> None:
    """Regenerate with: python -c "from trainguard.ingest.formats import render_markdown as r; open('docs/formats.md','w').write(r())" """
    assert DOCS.read_text() == render_markdown(), "docs/formats.md drifted from trainguard.ingest.formats"


# -- Ultralytics / YOLOv5 results.csv -------------------------------------------------------------------

V8_HEADER = ["epoch", "time", "train/box_loss", "train/cls_loss", "train/dfl_loss", "metrics/precision(B)",
             "metrics/recall(B)", "metrics/mAP50(B)", "metrics/mAP50-95(B)", "val/box_loss", "val/cls_loss",
             "val/dfl_loss", "lr/pg0", "lr/pg1", "lr/pg2"]


def ultralytics_rows(epochs: int, last: int, *, best_at: int | None = None, first: int = 1,
                     lrf: float = 0.01) -> list[list[str]]:
    """Rows as BaseTrainer.save_metrics writes them: 3 warmup epochs, then lr0 x lf(epoch), linear lf."""
    rows = []
    for i, e in enumerate(range(first, last + 1)):
        lf = (1 - i / epochs) * (1 - lrf) + lrf
        lr = 0.001 * lf * (min(1.0, (i + 1) / 3))
        peak = best_at if best_at is not None else i
        quality = (min(i, peak) - 0.01 * max(0, i - peak)) / max(1, epochs)  # below the best after it
        m50, m95 = 0.3 + 0.5 * quality, 0.1 + 0.4 * quality
        loss = 1.5 * math.exp(-i / 30) + 0.3
        rows.append([str(e), f"{10.0 * (i + 1):.1f}", f"{loss:.5f}", f"{loss * 2:.5f}", f"{loss * 1.1:.5f}",
                     "0.6", "0.5", f"{m50:.5f}", f"{m95:.5f}", f"{loss:.5f}", f"{loss * 2:.5f}", f"{loss:.5f}",
                     f"{lr:.6g}", f"{lr:.6g}", f"{lr:.6g}"])
    return rows


def write_results(folder: Path, rows: list[list[str]], header: list[str] = V8_HEADER, *, args: dict | None = None,
                  newline: str = "\n", tail: str = "") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    text = newline.join([",".join(header)] + [",".join(r) for r in rows]) + newline + tail
    (folder / "results.csv").write_bytes(text.encode())
    if args is not None:
        (folder / "args.yaml").write_text("".join(f"{k}: {v}\n" for k, v in args.items()))
    return folder / "results.csv"


def test_ultralytics_at_its_last_planned_epoch_is_completed(tmp_path: Path) -> None:
    p = write_results(tmp_path / "train", ultralytics_rows(40, 40), args={"task": "detect", "epochs": 40, "patience": 100})
    d = diagnose_path(p)
    assert d.state == "completed" and d.format == "ultralytics results.csv" and severe(d) == []


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_ultralytics_killed_at_107_of_600_is_cut_off(tmp_path: Path, newline: str) -> None:
    p = write_results(tmp_path / "train", ultralytics_rows(600, 107), args={"epochs": 600, "patience": 100},
                      newline=newline)
    d = diagnose_path(p)
    f = tg531(d)
    assert d.state == "unfinished" and f is not None and f.severity == "warning"
    assert "107 of the 600 epochs args.yaml plans (18%)" in f.summary


def test_ultralytics_early_stopping_by_patience_is_completed(tmp_path: Path) -> None:
    # best fitness at epoch 21, stopped 30 epochs later with patience 30: EarlyStopping's own rule
    p = write_results(tmp_path / "train", ultralytics_rows(300, 51, best_at=20), args={"epochs": 300, "patience": 30})
    d = diagnose_path(p)
    assert d.state == "completed" and severe(d) == []
    short = write_results(tmp_path / "short", ultralytics_rows(300, 40, best_at=20), args={"epochs": 300, "patience": 30})
    assert tg531(diagnose_path(short)) is not None  # 19 epochs since the best: patience 30 had not run out


def test_ultralytics_without_args_yaml_reads_its_lr_schedule(tmp_path: Path) -> None:
    early = write_results(tmp_path / "a", ultralytics_rows(100, 8))  # LR still ~95% of its peak, best = last
    d = diagnose_path(early)
    assert tg531(d) is not None and "LR still" in tg531(d).summary
    done = write_results(tmp_path / "b", ultralytics_rows(100, 100))  # decayed to lrf: nothing to say
    d = diagnose_path(done)
    assert d.state == "unknown" and severe(d) == []
    flat = write_results(tmp_path / "c", ultralytics_rows(100, 8, lrf=1.0))  # a constant LR never says
    assert severe(diagnose_path(flat)) == []


def test_ultralytics_variants_extra_columns_empty_cells_truncated_row(tmp_path: Path) -> None:
    rows = ultralytics_rows(20, 20)
    header = V8_HEADER + ["metrics/mAP50(M)"]
    rows = [r + [""] for r in rows]  # an extra column whose cells are empty
    rows[5][3] = ""  # an empty cell
    p = write_results(tmp_path / "train", rows, header, args={"epochs": 20}, tail="21,210.0,0.3")
    d = diagnose_path(p)
    assert d.state == "completed" and d.skipped == 1 and d.steps == 20


def test_ultralytics_nan_validation_loss_is_named(tmp_path: Path) -> None:
    """Non-finite validation losses beside finite training losses: the evaluation's arithmetic, named as such
    (transient, or broken from the first row as Ultralytics 8.0.x wrote val/cls_loss), a warning since what
    the run chooses from its evaluation reads a NaN; the same NaN in the training losses is the weights'."""
    rows = ultralytics_rows(30, 30)
    for r in rows[2:6]:
        r[9:12] = ["nan", "inf", "nan"]
    d = diagnose_path(write_results(tmp_path / "train", rows, args={"epochs": 30}))
    f = next(f for f in d.findings if f.name == "nonfinite-loss")
    assert f.severity == "warning" and f.cause == "eval-only" and f.step == 3 and "evaluation loss" in f.summary, \
        f.one_line()
    assert "evaluation 3" in f.summary
    always = ultralytics_rows(30, 30)
    for r in always:
        r[9:12] = ["0", "inf", "0"]
    d = diagnose_path(write_results(tmp_path / "always", always, args={"epochs": 30}))
    f = next(f for f in d.findings if f.name == "nonfinite-loss")
    assert f.severity == "warning" and f.cause == "eval-only" and "from the first evaluation" in f.summary
    for r in rows[2:6]:
        r[2:5] = ["nan", "nan", "nan"]  # the training losses too: the weights went bad
    d = diagnose_path(write_results(tmp_path / "both", rows, args={"epochs": 30}))
    loud = [f for f in d.findings if f.name == "nonfinite-loss" and f.severity in ("warning", "error")]
    assert loud and loud[0].step == 3, [f.one_line() for f in d.findings]


def test_yolov5_padded_zero_based_with_opt_yaml(tmp_path: Path) -> None:
    header = ["epoch", "train/box_loss", "train/obj_loss", "train/cls_loss", "metrics/precision", "metrics/recall",
              "metrics/mAP_0.5", "metrics/mAP_0.5:0.95", "val/box_loss", "val/obj_loss", "val/cls_loss",
              "x/lr0", "x/lr1", "x/lr2"]
    rows = [[f"{e:>20}", "0.05", "0.02", "0.01", "0.7", "0.6", f"{0.3 + e / 100:.4f}", f"{0.1 + e / 200:.4f}",
             "0.04", "0.02", "0.01", f"{0.01 * (1 - e / 50):.6f}", f"{0.01 * (1 - e / 50):.6f}",
             f"{0.01 * (1 - e / 50):.6f}"] for e in range(0, 50)]
    folder = tmp_path / "exp"
    write_results(folder, rows, [f"{h:>20}" for h in header])
    (folder / "opt.yaml").write_text("epochs: 50\npatience: 100\nresume: false\n")
    d = diagnose_path(folder / "results.csv")
    assert d.format == "yolov5 results.csv" and d.state == "completed"
    (folder / "opt.yaml").write_text("epochs: 300\npatience: 100\n")
    assert tg531(diagnose_path(folder / "results.csv")) is not None


# -- detectron2 metrics.json ---------------------------------------------------------------------------

def detectron2_rows(max_iter: int, last: int, *, period: int = 20) -> list[str]:
    """JSONWriter's rows: every part a median of its own window (they do not sum), eta from the printer."""
    out = []
    for it in range(period - 1, last + 1, period):
        cls, box, rpn = 0.8 * math.exp(-it / 400) + 0.05, 0.4, 0.02 * math.exp(-it / 100) + 1e-4
        out.append(json.dumps({"iteration": it, "total_loss": (cls + box + rpn) * 0.9, "loss_cls": cls,
                               "loss_box_reg": box, "loss_rpn_cls": rpn, "lr": 0.001, "time": 0.5,
                               "data_time": 0.01, "eta_seconds": 0.5 * (max_iter - it - 1)}))
    return out


def test_detectron2_finished_run_medians_are_not_judged_as_a_sum(tmp_path: Path) -> None:
    rows = detectron2_rows(2000, 1999)
    rows[-1] = json.dumps({**json.loads(rows[-1]), "bbox/AP": 31.5, "bbox/APl": float("nan")})
    p = tmp_path / "metrics.json"
    p.write_text("\n".join(rows) + "\n")
    d = diagnose_path(p)
    assert d.format == "detectron2 metrics.json" and d.state == "completed" and d.evals == 1
    assert not {"loss-parts-dont-sum", "loss-parts-imbalanced"} & {f.name for f in d.findings}


def test_detectron2_evaluation_written_as_a_row_of_its_own_keeps_the_training_rows_end(tmp_path: Path) -> None:
    # plain_train_net.py's do_test after training (or a custom loop's writer): an evaluation-only row with the
    # last iteration and no eta_seconds; the training row before it still says the run reached its end
    rows = detectron2_rows(2000, 1999) + [json.dumps({"iteration": 1999, "bbox/AP": 31.5, "bbox/AP50": 55.0})]
    p = tmp_path / "metrics.json"
    p.write_text("\n".join(rows) + "\n")
    d = diagnose_path(p)
    assert d.state == "completed" and d.evals == 1
    cut = detectron2_rows(3000, 400) + [json.dumps({"iteration": 400, "bbox/AP": 12.0})]
    p.write_text("\n".join(cut) + "\n")
    assert tg531(diagnose_path(p)) is not None  # and a cut run stays cut, evaluation row or not


def test_detectron2_cut_off_by_its_eta(tmp_path: Path) -> None:
    p = tmp_path / "metrics.json"
    p.write_text("\n".join(detectron2_rows(3000, 400)) + '\n{"iteration": 41')  # and a truncated last line
    d = diagnose_path(p)
    f = tg531(d)
    assert f is not None and f.severity == "warning" and "eta_seconds" in f.summary and d.skipped == 1


# -- mmengine vis_data ----------------------------------------------------------------------------------

def write_vis_data(folder: Path, *, max_epochs: int, last_epoch: int, iters_per_epoch: int = 5) -> Path:
    vis = folder / "vis_data"
    vis.mkdir(parents=True)
    (vis / "config.py").write_text(f"max_epochs = {max_epochs}\nmodel = dict(type='X')\n"
                                   "train_cfg = dict(by_epoch=True, max_epochs=max_epochs, val_interval=1)\n")
    lines = []
    for e in range(1, last_epoch + 1):
        for i in range(1, iters_per_epoch + 1):
            it = (e - 1) * iters_per_epoch + i
            lines.append(json.dumps({"lr": 0.02, "data_time": 0.01, "loss": 1.5 / it + 0.1, "loss_cls": 1.5 / it + 0.1,
                                     "time": 0.1, "epoch": e, "iter": it, "memory": 3000, "step": it}))
        lines.append(json.dumps({"accuracy/top1": 40 + e, "data_time": 0.05, "time": 0.1, "step": e}))
    (vis / "scalars.json").write_text("\n".join(lines) + "\n")
    return vis


def test_mmengine_vis_data_plan_and_its_two_step_axes(tmp_path: Path) -> None:
    d = diagnose_path(write_vis_data(tmp_path / "a", max_epochs=10, last_epoch=4))
    f = tg531(d)
    assert d.format == "mmengine scalars.json" and f is not None and f.severity == "warning"
    assert "epoch 4 (iteration 20) of the 10 epochs config.py plans" in f.summary and d.evals == 4
    d = diagnose_path(write_vis_data(tmp_path / "b", max_epochs=3, last_epoch=3))
    assert d.state == "completed" and severe(d) == []


# -- W&B run folder -------------------------------------------------------------------------------------

def write_wandb(run: Path, *, summary: dict, config: dict | None = None, output: str | None = None) -> Path:
    files = run / "files"
    files.mkdir(parents=True)
    (files / "wandb-summary.json").write_text(json.dumps(summary))
    (files / "config.yaml").write_text("_wandb:\n  desc: null\n  value: {}\n" + "".join(
        f"{k}:\n  desc: null\n  value: {v}\n" for k, v in (config or {}).items()))
    (files / "wandb-metadata.json").write_text(json.dumps({"program": "train.py"}))
    if output is not None:
        (files / "output.log").write_text(output)
    return run


def test_wandb_run_folder_console_crash_and_summary_plan(tmp_path: Path) -> None:
    write_wandb(tmp_path / "wandb" / "run-20240101_000000-abc", summary={"_step": 3, "loss": 2.0},
                          config={"epochs": 30}, output="epoch 1 loss=2.3\nTraceback (most recent call last):\n"
                          '  File "train.py", line 9, in <module>\n    step()\nKeyboardInterrupt\n')
    d = diagnose_path(tmp_path)  # the project folder: wandb/ then its newest run
    # Ctrl-C's KeyboardInterrupt: someone stopped it (killed by SIGINT, as the watchdog says), not a crash
    assert d.format == "wandb run folder" and d.state == "killed" and "run-killed" in severe(d)
    assert next(f for f in d.findings if f.name == "run-killed").cause == "interrupted"
    done = write_wandb(tmp_path / "done", summary={"_step": 99, "epoch": 10, "val_loss": 0.5, "lr": 1e-4},
                       config={"epochs": 10})
    d = diagnose_path(done)
    assert d.state == "completed" and severe(d) == []
    cut = write_wandb(tmp_path / "cut", summary={"_step": 9, "epoch": 2, "val_loss": 0.9, "lr": 1e-3},
                      config={"num_epochs": 10})
    assert tg531(diagnose_path(cut)) is not None
    quiet = write_wandb(tmp_path / "quiet", summary={"_step": 9, "test_acc": 0.7}, output="hello\n 50%|#####\n")
    assert severe(diagnose_path(quiet)) == []  # a console with no metrics and no plan: nothing to say
    with pytest.raises(UserError, match="never logged"):
        diagnose_path(write_wandb(tmp_path / "empty", summary={"_step": 0, "_runtime": 0.9, "parameter_count": 5}))


def _nanogpt_console(last: int) -> str:
    return "".join(f"step {i}: train loss {2 - i / 5000:.4f}, val loss {2.1 - i / 6000:.4f}\n" if i % 250 == 0 else
                   f"iter {i}: loss {2 - i / 5000:.4f}, time 57.71ms, mfu 6.24%\n" for i in range(0, last + 1, 10))


def test_wandb_run_folder_step_plan_from_config(tmp_path: Path) -> None:
    # nanoGPT under wandb: max_iters only in config.yaml, `iter` in the summary, the console's iter lines
    done = write_wandb(tmp_path / "done", summary={"iter": 5000, "train/loss": 1.0, "_step": 20},
                       config={"max_iters": 5000, "eval_interval": 250}, output=_nanogpt_console(5000))
    d = diagnose_path(done)
    assert d.state == "completed" and severe(d) == []
    cut = write_wandb(tmp_path / "cut", summary={"iter": 3000, "train/loss": 1.4, "_step": 12},
                      config={"max_iters": 5000}, output=_nanogpt_console(3000))
    f = tg531(diagnose_path(cut))
    assert f is not None and "3000" in f.summary and "max_iters 5000" in f.summary, f.summary


# -- ms-swift / Keras / Hugging Face ---------------------------------------------------------------------

def test_ms_swift_rounded_lr_at_the_planned_end_is_not_lr_zero(tmp_path: Path) -> None:
    """ms-swift rounds every float to 8 decimals: a cosine's last 1% prints learning_rate 0.0."""
    lines = []
    for s in range(5, 2005, 5):
        lr = round(1e-5 * 0.5 * (1 + math.cos(math.pi * s / 2000)), 8)
        row = json.dumps({"loss": round(2 / s + 0.1, 8), "acc": 0.9, "grad_norm": 1.0, "learning_rate": lr,
                          "train_speed(iter/s)": 0.5, "epoch": s / 1000, "global_step": s})
        lines += [row, row]  # two writers
    lines.append(json.dumps({"train_runtime": 1000.0, "train_loss": 0.2, "epoch": 2.0, "global_step": 2000}))
    p = tmp_path / "logging.jsonl"
    p.write_text("\n".join(lines) + "\n")
    d = diagnose_path(p)
    assert d.format == "ms-swift logging.jsonl" and d.state == "completed" and "lr-reaches-zero" not in severe(d)


def test_keras_multi_output_heads_are_not_judged_as_a_sum(tmp_path: Path) -> None:
    cols = ["epoch", "a_pred_loss", "b_pred_loss", "loss", "lr", "val_a_pred_loss", "val_b_pred_loss", "val_loss"]
    rows = [[str(e), f"{0.5 / (e + 1):.4f}", f"{0.3 / (e + 1):.4f}", f"{2.0 / (e + 1):.4f}", "0.001",
             f"{0.5 / (e + 1):.4f}", f"{0.3 / (e + 1):.4f}", f"{2.0 / (e + 1):.4f}"] for e in range(15)]
    p = tmp_path / "training_log.csv"
    p.write_text("\n".join(",".join(r) for r in [cols, *rows]) + "\n")
    d = diagnose_path(p)
    assert d.format == "keras csvlogger" and "loss-parts-dont-sum" not in [f.name for f in d.findings]


def test_weights_read_where_they_are_written(tmp_path: Path) -> None:
    from trainguard.ingest.events import Facts, metrics_to_events

    rows = metrics_to_events(3, {"loss": 1.0, "loss_kd": 2.0, "w_kd": 0.5}, Facts(), parts_from=("loss_kd",))
    assert rows[0]["parts"] == {"loss_kd": 2.0} and rows[0]["weights"] == {"loss_kd": 0.5}


def trainer_state(max_steps: int, last: int, *, summary: bool, indent: int | None = 2) -> str:
    history = [{"epoch": s / 100, "grad_norm": 1.0, "learning_rate": 5e-5 * (1 - s / max_steps), "loss": 2 / s + 0.5,
                "step": s} for s in range(10, last + 1, 10)]
    history += [{"epoch": last / 100, "eval_loss": 0.9, "step": last}]
    if summary:
        history.append({"epoch": last / 100, "step": last, "total_flos": 1e15, "train_loss": 0.8,
                        "train_runtime": 100.0})
    state = {"best_metric": None, "epoch": last / 100, "global_step": last, "log_history": history,
             "logging_steps": 10, "max_steps": max_steps, "num_train_epochs": 3, "save_steps": 500}
    return json.dumps(state, indent=indent, sort_keys=True)


@pytest.mark.parametrize("indent", [2, None])
def test_trainer_state_streamed_plan_after_history(tmp_path: Path, indent: int | None) -> None:
    p = tmp_path / "trainer_state.json"
    p.write_bytes(trainer_state(1000, 1000, summary=True, indent=indent).replace("\n", "\r\n").encode())
    d = diagnose_path(p)
    assert d.state == "completed" and d.steps == 100 and d.evals == 1
    snap = tmp_path / "out" / "checkpoint-400"
    snap.mkdir(parents=True)
    (snap / "trainer_state.json").write_text(trainer_state(1000, 400, summary=False))
    d = diagnose_path(tmp_path / "out")
    f = tg531(d)
    assert f is not None and f.severity == "info" and "40%" in f.summary


def test_trainer_state_truncated_is_one_line(tmp_path: Path) -> None:
    p = tmp_path / "trainer_state.json"
    p.write_text(trainer_state(1000, 500, summary=False)[:-300])
    with pytest.raises(UserError, match="not valid JSON"):
        diagnose_path(p)


def test_a_loss_logged_per_epoch_is_judged_over_its_epochs(tmp_path: Path) -> None:
    """One row per epoch: TG204 compares the first half of the epochs with the second, once, at the end."""
    def keras(name: str, losses: list[float]) -> Path:
        p = tmp_path / name
        p.write_text("epoch,accuracy,loss,val_accuracy,val_loss\n" + "".join(
            f"{e},0.5,{v:.5f},0.5,{v + 0.01:.5f}\n" for e, v in enumerate(losses)))
        return p

    flat = keras("flat.csv", [0.6931 + 0.0003 * ((e * 7) % 5 - 2) for e in range(20)])
    assert "loss-not-decreasing" in severe(diagnose_path(flat))
    learning = keras("learning.csv", [0.69 * 0.93 ** e for e in range(20)])
    assert severe(diagnose_path(learning)) == []
    short = keras("short.csv", [0.4512 + 0.001 * (e % 3) for e in range(7)])  # fewer than 16 epochs: too few
    assert "loss-not-decreasing" not in severe(diagnose_path(short))
    # unless every epoch sits at ln(K), the loss of a uniform guess: then 7 epochs say it never learned
    chance = keras("chance.csv", [0.6931 + 0.001 * (e % 3) for e in range(7)])
    found = [f for f in diagnose_path(chance).findings if f.name == "loss-not-decreasing"]
    assert [f.cause for f in found] == ["at-chance"] and "ln(2)" in found[0].summary


def test_lightning_metrics_csv_whose_losses_are_all_named_loss(tmp_path: Path) -> None:
    """`mean_loss` beside its parts `ce_loss`, `kd_loss` (no column named `loss`): read, not refused."""
    version = tmp_path / "lightning_logs" / "version_0"
    version.mkdir(parents=True)
    rows = ["epoch,step,ce_loss,kd_loss,mean_loss,val_loss"]
    for s in range(0, 200):
        ce, kd = 2 / (1 + s / 50) + 0.1, 1 / (1 + s / 30) + 0.05
        val = f"{ce:.4f}" if s % 20 == 19 else ""
        rows.append(f"{s // 20},{s},{ce:.4f},{kd:.4f},{(ce + kd) / 2:.4f},{val}")
    (version / "metrics.csv").write_text("\n".join(rows) + "\n")
    (version / "hparams.yaml").write_text("max_epochs: 10\n")
    d = diagnose_path(tmp_path)
    assert d.format == "lightning metrics.csv" and d.steps == 200 and d.state == "completed"
    assert severe(d) == []


def test_a_resumed_ultralytics_run_continues_its_file(tmp_path: Path) -> None:
    """Resumed from last.pt (args.yaml `resume:` names it): the epochs go on, the time column restarts."""
    rows = ultralytics_rows(30, 30)
    for r in rows[12:]:
        r[1] = f"{float(r[1]) - 120:.1f}"
    p = write_results(tmp_path / "train", rows, args={"epochs": 30, "patience": 100, "resume": "runs/detect/train/weights/last.pt"})
    d = diagnose_path(p)
    assert d.state == "completed" and severe(d) == []


def test_a_python_config_is_parsed_never_run(tmp_path: Path) -> None:
    from trainguard.ingest import formats
    from trainguard.ingest.plans import read_plan

    marker = tmp_path / "ran"
    (tmp_path / "config.py").write_text(f"import os\nos.system('touch {marker}')\nmax_epochs = 12\n"
                                        "train_cfg = dict(by_epoch=True, max_epochs=max_epochs)\n")
    plan = read_plan(tmp_path, formats.contract("mmengine scalars.json"))
    assert plan.length == 12 and plan.length_key == "train_cfg.max_epochs" and not marker.exists()
    (tmp_path / "config.py").write_text("max_epochs = (\n")  # a config that does not parse: no plan
    assert read_plan(tmp_path, formats.contract("mmengine scalars.json")).length is None


# -- folder discovery and tables without an epoch column (issue 30) ---------------------------------------

def test_llama_factory_and_ms_swift_output_folders_are_read(tmp_path: Path) -> None:
    # LogCallback.on_log: one record per logging step with current_steps/total_steps; all_results.json at the end
    lf = tmp_path / "lf"
    lf.mkdir()
    rows = [{"current_steps": s, "total_steps": 100, "loss": round(2 / s + 0.5, 4), "lr": 1e-4 * (1 - s / 100),
             "epoch": s / 50, "percentage": float(s), "elapsed_time": "0:01:00", "remaining_time": "0:01:00"}
            for s in range(5, 101, 5)]
    (lf / "trainer_log.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (lf / "all_results.json").write_text(json.dumps({"epoch": 2.0, "train_loss": 0.6, "train_runtime": 60.0}))
    d = diagnose_path(lf)
    assert d.format == "llama-factory trainer_log.jsonl" and d.state == "completed" and severe(d) == []
    # ms-swift's output folder: logging.jsonl with `global_step/max_steps`, cut off at 40 of 500
    ms = tmp_path / "ms"
    ms.mkdir()
    rows = [{"loss": round(2 / s + 0.5, 4), "learning_rate": 1e-4, "epoch": s / 250,
             "global_step/max_steps": f"{s}/500"} for s in range(5, 41, 5)]
    (ms / "logging.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    d = diagnose_path(ms)
    assert d.format == "ms-swift logging.jsonl" and "log-ends-unfinished" in severe(d)


@pytest.mark.parametrize("index", [True, False])
def test_a_keras_history_table_without_an_epoch_column_counts_its_rows(tmp_path: Path, index: bool) -> None:
    # pd.DataFrame(history.history).to_csv(path, index=index): History's keys in fit order, no epoch column
    cols = ["loss", "acc", "val_loss", "val_acc"]
    lines = [("," if index else "") + ",".join(cols)]
    for e in range(12):
        loss = 1.0 / (e + 1) if e < 8 else float("nan")
        lines.append((f"{e}," if index else "") + f"{loss},{0.5 + e / 40},{1.1 / (e + 1)},{0.45 + e / 40}")
    p = tmp_path / "training_log.csv"
    p.write_text("\n".join(lines) + "\n")
    d = diagnose_path(p)
    assert d.format == "keras history csv" and d.steps >= 11 and d.evals == 12
    f = next(f for f in d.findings if f.name == "nonfinite-loss")
    assert f.step == 8
    # a table whose val_ column has no training twin is no History: refused as before
    q = tmp_path / "other.csv"
    q.write_text("loss,val_score\n1.0,0.5\n")
    with pytest.raises(UserError, match="without a step or epoch column"):
        diagnose_path(q)


def _mmcv_log_json(path: Path, epochs: int, last_epoch: int, *, per: int = 50, every: int = 10,
                   runner: str = "EpochBasedRunner", val: bool = True) -> Path:
    """TextLoggerHook: the meta record first, then one record per log() call; iter within the epoch."""
    config = (f"model = dict(type='ResNet')\noptimizer = dict(type='SGD', lr=0.01)\n"
              f"runner = dict(type='{runner}', max_epochs={epochs})\ncheckpoint_config = dict(interval=1)\n")
    lines = [json.dumps({"env_info": "sys.platform: linux", "config": config, "seed": 0, "exp_name": "r.py"})]
    for e in range(1, last_epoch + 1):
        for i in range(every, per + 1, every):
            s = (e - 1) * per + i
            lines.append(json.dumps({"mode": "train", "epoch": e, "iter": i, "lr": 0.01, "memory": 900,
                                     "data_time": 0.01, "loss_cls": round(1 / s, 5), "loss": round(2 / s + 0.1, 5),
                                     "time": 0.1}))
        if val:
            lines.append(json.dumps({"mode": "val", "epoch": e, "iter": 125, "lr": 0.01,
                                     "accuracy_top-1": 60 + e + 0.5}))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_mmcv_log_json_global_step_evaluations_and_plan_from_its_config(tmp_path: Path) -> None:
    done = diagnose_path(_mmcv_log_json(tmp_path / "20230207_121050.log.json", 12, 12))
    assert done.format == "mmcv log.json" and done.state == "completed" and severe(done) == []
    assert done.evals == 12 and done.steps == 12 * 5
    from trainguard.ingest.detect import open_source

    steps = [e["step"] for e in open_source(tmp_path / "20230207_121050.log.json").events if e["kind"] == "step"]
    assert steps == sorted(set(steps)) and steps[-1] == 12 * 50  # (epoch - 1) x per epoch + iter
    cut = diagnose_path(_mmcv_log_json(tmp_path / "cut.log.json", 12, 3))
    f = tg531(cut)
    assert f is not None and f.severity == "warning" and "epoch 3 of 12" in f.summary
    # cut inside its first epoch, no evaluation yet: epoch 0 of 12 done
    first = diagnose_path(_mmcv_log_json(tmp_path / "first.log.json", 12, 1, val=False))
    f = tg531(first)
    assert f is not None and f.severity == "warning" and "epoch 0 of 12" in f.summary


def test_llama_factory_closing_summary_record_one_short_of_total_steps(tmp_path: Path) -> None:
    # LogCallback.on_log copies loss/eval_loss/lr... from the last log_history row and drops the Nones: the
    # train() summary row (train_runtime, train_loss) leaves a record with none of them, at the steps run
    def rec(s: int, **kw: float) -> str:
        return json.dumps({"current_steps": s, "total_steps": 201, **kw, "epoch": round(s / 100, 2),
                           "percentage": round(s / 201 * 100, 2), "elapsed_time": "0:10:00",
                           "remaining_time": "0:00:03"})

    rows = [rec(s, loss=round(2 / s + 0.4, 4), lr=1e-4) for s in range(10, 201, 10)]
    p = tmp_path / "trainer_log.jsonl"
    p.write_text("\n".join(rows + [rec(200)]) + "\n")
    assert diagnose_path(p).state == "completed"
    # an evaluation as the last record is no summary: the run stopped one step short of its plan
    p.write_text("\n".join(rows + [rec(200, eval_loss=0.5)]) + "\n")
    assert tg531(diagnose_path(p)) is not None


def _lightning_csv(folder: Path, epochs: int, per_epoch: int = 100, test: bool = False, planned: int | None = None) -> Path:
    """CSVLogger's file for `self.log("train_loss", on_epoch=True)` and `self.log("val_loss")`: an epoch's
    validation row and its epoch-end row at the epoch's last step; trainer.test() adds a test_* row."""
    folder.mkdir(parents=True)
    rows = ["epoch,step,train_loss_epoch,val_loss,test_loss"]
    for e in range(epochs):
        step = (e + 1) * per_epoch - 1
        rows += [f"{e},{step},,{1.0 / (e + 1):.4f},", f"{e},{step},{1.1 / (e + 1):.4f},,"]
    if test:
        rows.append(f"{epochs},{epochs * per_epoch},,,{1.0 / epochs:.4f}")
    (folder / "metrics.csv").write_text("\n".join(rows) + "\n")
    if planned is not None:
        (folder / "hparams.yaml").write_text(f"max_epochs: {planned}\nlr: 0.001\n")
    return folder


def test_lightning_metrics_csv_ending_on_an_epoch_end_row_is_no_proof_of_an_end(tmp_path: Path) -> None:
    # CSVLogger flushes every flush_logs_every_n_steps and at fit's end: a kill leaves an epoch-end row last too
    d = diagnose_path(_lightning_csv(tmp_path / "v0", 8))
    assert d.state == "unknown" and severe(d) == []
    planned = diagnose_path(_lightning_csv(tmp_path / "v1", 8, planned=20))
    f = tg531(planned)
    assert f is not None and f.severity == "info" and "epoch 7 of the 20 hparams.yaml plans" in f.summary
    assert "without a plan" not in f.summary
    # fit() returned: trainer.test() wrote its row; or the last planned epoch closed
    assert diagnose_path(_lightning_csv(tmp_path / "v2", 8, test=True)).state == "completed"
    assert diagnose_path(_lightning_csv(tmp_path / "v3", 20, planned=20)).state == "completed"
