"""The console and metrics formats of the frameworks people train with, reproduced here and read by `diagnose`.

Each writer below prints a run the way that framework prints it (the shapes were read in their public
repositories and documentation; no file of theirs is copied): a healthy run must read as its steps and
evaluations, complete, with no warning; the same run with its loss gone NaN half way must be named.

Run: pytest tests/test_log_formats.py        (a few seconds)
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import pytest

from trainguard.ingest.diagnose import diagnose_path

EPOCHS, PER_EPOCH, EVERY = 4, 200, 10  # batches per epoch, logged every EVERY


def loss_at(step: int, nan_from: int | None) -> float:
    if nan_from is not None and step >= nan_from:
        return float("nan")
    return 0.4 + 3.0 * math.exp(-step / 250) + 0.02 * math.sin(step)


def lr_at(step: int) -> float:
    total = EPOCHS * PER_EPOCH
    return 1e-4 * min(1.0, step / 50) * (0.1 + 0.45 * (1 + math.cos(math.pi * step / total)))


def _steps():
    for e in range(EPOCHS):
        for b in range(EVERY, PER_EPOCH + 1, EVERY):
            yield e, b, e * PER_EPOCH + b


def torchvision_references(nan_from: int | None) -> str:
    """torchvision's detection/classification references: `Epoch: [0]  [10/200]  eta: ...  loss: x (avg)`."""
    out = []
    for e, b, s in _steps():
        lo = loss_at(s, nan_from)
        out.append(f"Epoch: [{e}]  [{b:3d}/{PER_EPOCH}]  eta: 0:01:10  lr: {lr_at(s):.6f}  loss: {lo:.4f} ({lo:.4f})  "
                   f"loss_classifier: {lo * 0.4:.4f} ({lo * 0.4:.4f})  loss_box_reg: {lo * 0.6:.4f} ({lo * 0.6:.4f})  "
                   f"time: 0.3120  data: 0.0100  max mem: 2547")
        if b == PER_EPOCH:
            out.append(f"Epoch: [{e}] Total time: 0:01:02 (0.3120 s / it)")
            out.append("Test:  [ 0/50]  eta: 0:00:10  model_time: 0.1  evaluator_time: 0.01  time: 0.2  data: 0.01")
    out.append("Training time 0:04:10")
    out.append("Training complete")  # the references end with the total time; the script's own last print
    return "\n".join(out) + "\n"


def mmengine_epoch(nan_from: int | None) -> str:
    """mmengine's LogProcessor, by epoch: `Epoch(train) [1][10/200]  lr: ...  loss: x`, `Epoch(val) [1][5/5]`."""
    out = []
    for e, b, s in _steps():
        lo = loss_at(s, nan_from)
        out.append(f"08/21 02:58:41 - mmengine - INFO - Epoch(train) [{e + 1}][{b:3d}/{PER_EPOCH}]  lr: {lr_at(s):.4e}  "
                   f"eta: 0:00:30  time: 0.0190  data_time: 0.0040  memory: 3012  loss_cls: {lo * 0.3:.4f}  "
                   f"loss_bbox: {lo * 0.7:.4f}  loss: {lo:.4f}")
        if b == PER_EPOCH:
            out.append(f"08/21 02:58:42 - mmengine - INFO - Epoch(val) [{e + 1}][5/5]  accuracy/top1: {60 + 5 * e + 0.37:.4f}"
                       "  data_time: 0.0030  time: 0.0100")
    return "\n".join(out) + "\n"


def mmengine_iter(nan_from: int | None) -> str:
    """mmengine by iteration: `Iter(train) [  100/800]  lr: ...` (the denominator is the run's length)."""
    total = EPOCHS * PER_EPOCH
    return "".join(f"08/21 02:58:41 - mmengine - INFO - Iter(train) [{s:5d}/{total}]  lr: {lr_at(s):.4e}  eta: 0:00:30  "
                   f"time: 0.0190  data_time: 0.0040  memory: 3012  loss: {loss_at(s, nan_from):.4f}\n"
                   for _, _, s in _steps())


def timm_train(nan_from: int | None) -> str:
    """timm's train.py: `Train: 0 [  10/200 (  5%)]  Loss: x (avg)  Time: ...  LR: ...  Data: ...`."""
    out = []
    for e, b, s in _steps():
        lo = loss_at(s, nan_from)
        out.append(f"Train: {e} [{b:4d}/{PER_EPOCH} ({100 * b // PER_EPOCH:3d}%)]  Loss: {lo:#.3g} ({lo:#.3g})  "
                   f"Time: 0.312s,  410.26/s  (0.312s,  410.26/s)  LR: {lr_at(s):.3e}  Data: 0.010 (0.010)")
        if b == PER_EPOCH:
            out.append(f"Test: [  50/50]  Time: 0.101 (0.120)  Loss:  {1.2 - 0.1 * e:>6.3f} ({1.2 - 0.1 * e:>6.3f})  "
                       f"Acc@1: {60 + 5 * e:>7.3f} ({60 + 5 * e:>7.3f})  Acc@5: {85 + e:>7.3f} ({85 + e:>7.3f})")
    out.append(f"*** Best metric: {60 + 5 * (EPOCHS - 1)} (epoch {EPOCHS - 1})")
    return "\n".join(out) + "\n"


def fairseq_simple(nan_from: int | None) -> str:
    """fairseq's `--log-format simple`: inner lines `epoch 001:  10 / 200 loss=..., num_updates=10, lr=...`,
    epoch summaries and validation as `epoch 001 | valid on 'valid' subset | loss ... | num_updates 200`."""
    out = []
    for e, b, s in _steps():
        lo = loss_at(s, nan_from)
        out.append(f"epoch {e + 1:03d}:  {b:4d} / {PER_EPOCH} loss={lo:.3f}, nll_loss={lo * 0.9:.3f}, ppl={2 ** (lo * 0.9):.2f}, "
                   f"wps=12345.6, ups=3.21, wpb=3840.2, bsz=128, num_updates={s}, lr={lr_at(s):.4g}, gnorm=1.234, "
                   f"train_wall=30, gb_free=10.2, wall={s // 3}")
        if b == PER_EPOCH:
            vl = 1.5 - 0.1 * e
            out.append(f"epoch {e + 1:03d} | valid on 'valid' subset | loss {vl:.3f} | nll_loss {vl * 0.9:.3f} | "
                       f"ppl {2 ** (vl * 0.9):.2f} | wps 45678.9 | wpb 3000.1 | bsz 100 | num_updates {s} | best_loss 1.5")
            out.append(f"epoch {e + 1:03d} | loss {lo:.3f} | nll_loss {lo * 0.9:.3f} | ppl {2 ** (lo * 0.9):.2f} | "
                       f"wps 12000.1 | ups 3.2 | wpb 3840.2 | bsz 128 | num_updates {s} | lr {lr_at(s):.4g} | gnorm 1.2")
    out.append("done training in 1234.5 seconds")
    return "\n".join(out) + "\n"


def paddleocr(nan_from: int | None) -> str:
    """PaddleOCR: `ppocr INFO: epoch: [1/4], global_step: 10, lr: 0.001, loss: 3.2, avg_reader_cost: ...`."""
    out = []
    for e, b, s in _steps():
        out.append(f"[2022/08/01 12:00:00] ppocr INFO: epoch: [{e + 1}/{EPOCHS}], global_step: {s}, lr: {lr_at(s):.6f}, "
                   f"loss: {loss_at(s, nan_from):.6f}, avg_reader_cost: 0.10108 s, avg_batch_cost: 0.50123 s, "
                   f"avg_samples: 16.0, ips: 31.92127 samples/s, eta: 0:10:00")
        if b == PER_EPOCH:
            out.append(f"[2022/08/01 12:00:05] ppocr INFO: cur metric, acc: {0.6 + 0.05 * e:.4f}, norm_edit_dis: 0.9, fps: 100.1")
    out.append("[2022/08/01 12:10:00] ppocr INFO: best metric, acc: 0.75, norm_edit_dis: 0.9")
    return "\n".join(out) + "\n"


def nanogpt(nan_from: int | None) -> str:
    """nanoGPT: `step 200: train loss 2.1, val loss 2.3` every eval_interval, `iter 10: loss 4.2, time 30.12ms, mfu 12%`."""
    out = []
    for _, _, s in _steps():
        if s % 200 == 0:
            out.append(f"step {s}: train loss {loss_at(s, nan_from):.4f}, val loss {loss_at(s, nan_from) + 0.1:.4f}")
        out.append(f"iter {s}: loss {loss_at(s, nan_from):.4f}, time 30.12ms, mfu 12.34%")
    out.append(f"done: {EPOCHS * PER_EPOCH} steps")  # the run's own last print (nanoGPT itself prints none)
    return "\n".join(out) + "\n"


def pipe_table(nan_from: int | None) -> str:
    """A hand-written DDP script's prints, cells between bars with no `=` or `:` anywhere:
    `step 50 | loss 4.75 | lr 5.1e-04 | grad_norm 0.51 | 34.7 ms/step`, and an evaluation line of its own,
    `eval step 500 | val_loss 0.0556 | val_exact 0.994 | 12.9 s` (a new user's; its evaluations were missed)."""
    out = []
    for _, _, s in _steps():
        out.append(f"step {s} | loss {loss_at(s, nan_from):.4f} | lr {lr_at(s):.2e} | grad_norm 0.513 | 34.7 ms/step")
        if s % PER_EPOCH == 0:
            out.append(f"eval step {s} | val_loss {loss_at(s, nan_from) + 0.1:.4f} | val_exact 0.994 | 12.9 s")
    out.append("training done")
    return "\n".join(out) + "\n"


def ms_swift_stdout(nan_from: int | None) -> str:
    """ms-swift prints the Trainer's logs with its step as `'global_step/max_steps': '10/800'`."""
    total = EPOCHS * PER_EPOCH
    return "".join(
        str({"loss": round(loss_at(s, nan_from), 5), "grad_norm": 1.1, "learning_rate": lr_at(s), "memory(GiB)": 20.5,
             "train_speed(iter/s)": 0.41, "epoch": round(s / PER_EPOCH, 2), "global_step/max_steps": f"{s}/{total}",
             "percentage": f"{100 * s / total:.2f}%", "elapsed_time": "1m 2s", "remaining_time": "9m"}) + "\n"
        for _, _, s in _steps())


WRITERS: dict[str, tuple[Callable[[int | None], str], str]] = {
    "torchvision": (torchvision_references, "train.log"),
    "mmengine-epoch": (mmengine_epoch, "20230821_025841.log"),
    "mmengine-iter": (mmengine_iter, "20230821_025841.log"),
    "timm": (timm_train, "train.log"),
    "fairseq": (fairseq_simple, "train.log"),
    "paddleocr": (paddleocr, "train.log"),
    "nanogpt": (nanogpt, "train.log"),
    "ms-swift": (ms_swift_stdout, "train.log"),
    "pipe-table": (pipe_table, "train.log"),
}


@pytest.mark.parametrize("fmt", sorted(WRITERS))
def test_framework_console_format_reads_healthy_and_names_nan(tmp_path: Path, fmt: str) -> None:
    write, name = WRITERS[fmt]
    log = tmp_path / name
    log.write_text(write(None))
    d = diagnose_path(log)
    loud = [f.one_line() for f in d.findings if f.severity in ("warning", "error")]
    assert loud == [] and d.steps >= 0.9 * EPOCHS * PER_EPOCH / EVERY, (d.steps, loud)
    assert "loss" not in {n for _, n in d.not_run}
    log.write_text(write(nan_from=EPOCHS * PER_EPOCH // 2))
    d = diagnose_path(log)
    nan = next((f for f in d.findings if f.name == "nonfinite-loss"), None)
    assert nan is not None and abs(nan.step - EPOCHS * PER_EPOCH // 2) <= 2 * EVERY, [f.one_line() for f in d.findings]


def test_evaluations_of_the_formats_that_print_them(tmp_path: Path) -> None:
    for fmt, evals in (("mmengine-epoch", EPOCHS), ("fairseq", EPOCHS), ("nanogpt", EPOCHS), ("timm", EPOCHS),
                        ("pipe-table", EPOCHS)):
        write, name = WRITERS[fmt]
        (tmp_path / name).write_text(write(None))
        assert diagnose_path(tmp_path / name).evals == evals, fmt


def test_ms_swift_logging_jsonl_and_wandb_history_export(tmp_path: Path) -> None:
    total = EPOCHS * PER_EPOCH
    jl = tmp_path / "logging.jsonl"
    jl.write_text("".join(json.dumps({"loss": loss_at(s, None), "grad_norm": 1.0, "learning_rate": lr_at(s),
                                      "epoch": s / PER_EPOCH, "global_step/max_steps": f"{s}/{total}",
                                      "elapsed_time": "1m"}) + "\n" for _, _, s in _steps()))
    d = diagnose_path(jl)
    assert (d.format, d.state, d.steps, d.findings) == ("ms-swift logging.jsonl", "completed", 80, [])
    # a W&B run's history exported to CSV: `_step`, `_runtime`, `_timestamp` beside the logged keys
    csv = tmp_path / "wandb_export.csv"
    csv.write_text("_step,_runtime,_timestamp,train/loss,train/learning_rate,eval/loss\n" + "".join(
        f"{s},{s * 0.3:.1f},{1.7e9 + s:.0f},{loss_at(s, None):.5f},{lr_at(s):.3e},{'' if s % 200 else 1.0}\n"
        for _, _, s in _steps()))
    d = diagnose_path(csv)
    assert d.steps == 80 and d.evals == EPOCHS and [f for f in d.findings if f.severity != "info"] == []


def test_lines_of_cells_without_a_metric_are_no_metrics(tmp_path: Path) -> None:
    """Bars around numbers are not enough (a test summary, a shell pipeline, a table of settings): only
    cells named as a metric make a table line a metrics line."""
    from trainguard.ingest.events import Facts
    from trainguard.ingest.textlog import _LineParser

    parser = _LineParser(Facts())
    for line in ("| test 5 | passed 12 | failed 0 |", "| Top 5 | dev 3 | val 2 |",
                 "python eval.py --n 3 | tee log | head -5", "| layer 12 | heads 16 | dim 1024 |"):
        assert parser.feed(1, line) == [], line
    got = parser.feed(2, "eval step 500 | val_loss 0.0556 | val_exact 0.994 | 12.9 s")
    assert [(e["kind"], e["step"], e["data"]) for e in got] == [("eval", 500, {"loss": 0.0556, "exact": 0.994})]
