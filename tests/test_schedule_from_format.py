"""Schedules judged by what the log's format promises: YOLO's only decays, llm.c prints its LR to 6 decimals.

YOLOv5 and Ultralytics schedule every param group as lr0 x lf(epoch), lf falling from 1 to lrf after
a warm-up (ultralytics/yolov5 train.py, ultralytics/engine/trainer.py `_setup_scheduler`): a jump back up
after the decay is the schedule started over. A generic CSV promises no such thing (cosine with warm
restarts is a schedule people choose), and stays quiet. Files written here from the writers' columns.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from trainguard.ingest.detect import open_source
from trainguard.ingest.diagnose import diagnose_source

pytestmark = pytest.mark.unit

COLS = ["epoch", "train/box_loss", "train/obj_loss", "train/cls_loss", "metrics/precision", "metrics/recall",
        "metrics/mAP_0.5", "metrics/mAP_0.5:0.95", "val/box_loss", "val/obj_loss", "val/cls_loss",
        "x/lr0", "x/lr1", "x/lr2"]


def _lr(epoch: int, epochs: int, lr0: float = 0.01, lrf: float = 0.01) -> float:
    return lr0 * ((1 - epoch / epochs) * (1.0 - lrf) + lrf)


def _write(folder: Path, lrs: list[float]) -> Path:
    folder.mkdir()
    rows = [",".join(f"{c:>20}" for c in COLS)]
    for e, lr in enumerate(lrs):
        m = 0.1 + 0.35 * (1 - 0.9 ** e)
        rows.append(",".join(f"{v:>20}" for v in [e, 0.06 - 0.0005 * e, 0.03, 0.01, m + 0.1, m, m, m / 2, 0.05,
                                                   0.02, 0.005, lr, lr, lr]))
    (folder / "results.csv").write_text("\n".join(rows) + "\n")
    (folder / "opt.yaml").write_text("epochs: 40\npatience: 100\nresume: true\n")
    return folder / "results.csv"


def _tg105(path: Path) -> list:
    return [f for f in diagnose_source(open_source(path)).findings if f.code == "TG105"]


def test_a_yolov5_schedule_that_jumps_back_to_lr0_after_its_decay_started_over(tmp_path: Path) -> None:
    lrs = [_lr(e, 25) for e in range(25)] + [0.01] + [_lr(e, 40) for e in range(26, 40)]
    found = _tg105(_write(tmp_path / "exp", lrs))
    assert len(found) == 1 and found[0].cause == "jump-after-decay" and found[0].step == 25
    assert found[0].evidence["ratio"] > 5


def test_a_yolov5_run_resumed_properly_continues_its_schedule_and_is_quiet(tmp_path: Path) -> None:
    assert _tg105(_write(tmp_path / "exp", [_lr(e, 40) for e in range(40)])) == []


def test_a_restart_a_third_of_the_way_into_the_decay_is_said_and_a_warm_up_rise_is_not(tmp_path: Path) -> None:
    # lf at 40% of a linear decay is 0.6: a restart there rises 1.65x, far above any rounding of the writer
    lrs = [_lr(e, 40) for e in range(16)] + [_lr(e - 16, 40) for e in range(16, 40)]
    found = _tg105(_write(tmp_path / "exp", lrs))
    assert len(found) == 1 and found[0].step == 16 and 1.5 < found[0].evidence["ratio"] < 1.8
    # the warm-up's rise (the weight groups from 0 to lr0 over the first epochs) comes before any decay
    warm = [0.01 * min(1.0, (e + 1) / 4) * _lr(e, 40) / 0.01 for e in range(40)]
    assert _tg105(_write(tmp_path / "warm", warm)) == []


def test_a_generic_csv_whose_lr_restarts_is_a_schedule_someone_chose(tmp_path: Path) -> None:
    # SGDR: the same jump, in a format that promises no monotone schedule
    lrs = [0.01 * (1 - (e % 20) / 20) + 1e-4 for e in range(40)]
    path = tmp_path / "log.csv"
    path.write_text("step,loss,lr\n" + "".join(f"{e},{1.0 / (e + 1):.4f},{lr:.6f}\n" for e, lr in enumerate(lrs)))
    assert _tg105(path) == []


def _llmc_log(path: Path, steps: int, zero_from: int, evals_same_from: int) -> Path:
    """llm.c's log file (`s:N trl:X lr:%.6f norm:Y`, `s:N tel:X` every 250 steps): a cosine to 0 whose last
    values print as 0.000000."""
    import math

    out = []
    for s in range(steps):
        lr = 6e-4 * 0.5 * (1 + math.cos(math.pi * s / zero_from)) if s < zero_from else 0.0
        out.append(f"s:{s} trl:{3.3 + 1.0 / (1 + s / 500):.4f} lr:{lr:.6f} norm:0.24")
        if s % 250 == 0 or s == steps - 1:
            tel = 3.2722 if s >= evals_same_from else 3.27 + 1.0 / (1 + s / 300)
            out.append(f"s:{s + 1 if s == steps - 1 else s} tel:{tel:.4f}")
    path.write_text("\n".join(out) + "\n")
    return path


def test_a_cosine_to_zero_printed_as_zero_at_its_end_is_neither_lr_zero_nor_frozen(tmp_path: Path) -> None:
    # the last 1.8% of a cosine to 0 prints lr:0.000000; its last three evaluations agree to 4 decimals
    path = _llmc_log(tmp_path / "main.log", 6000, 6000, 5500)
    found = diagnose_source(open_source(path)).findings
    assert [f.code for f in found if f.code in ("TG101", "TG203")] == []


def test_a_printed_zero_over_most_of_the_log_is_still_lr_zero(tmp_path: Path) -> None:
    # seed 002's mechanism printed at the same resolution: the schedule ended after a fifth of the run
    path = _llmc_log(tmp_path / "main.log", 6000, 1200, 10**9)
    found = [f for f in diagnose_source(open_source(path)).findings if f.code == "TG101"]
    assert len(found) == 1 and 1100 <= found[0].step <= 1250


@pytest.mark.parametrize("lr_tag, said", [("x/lr0", True), ("lr", False)])
def test_a_yolo_writers_event_file_restarting_its_schedule_is_said_and_a_generic_one_is_not(
        tmp_path: Path, lr_tag: str, said: bool) -> None:
    # the TensorBoard callback's tags as YOLOv5 writes them (utils/loggers: train/*_loss, metrics/*, x/lr0..2),
    # through torch's own SummaryWriter; a generic `lr` tag promises no schedule
    from torch.utils.tensorboard import SummaryWriter

    lrs = [_lr(e, 25) for e in range(25)] + [0.01] + [_lr(e, 40) for e in range(26, 40)]
    with SummaryWriter(str(tmp_path / "exp")) as w:
        for e, lr in enumerate(lrs):
            w.add_scalar("train/box_loss", 0.06 - 0.0005 * e, e)
            w.add_scalar("train/obj_loss", 0.03, e)
            w.add_scalar("metrics/mAP_0.5", 0.1 + 0.35 * (1 - 0.9 ** e), e)
            w.add_scalar(lr_tag, lr, e)
    found = _tg105(tmp_path / "exp")
    assert (len(found) == 1 and found[0].step == 25) if said else found == []
