"""Ultralytics (YOLOv8 and later) and YOLOv5: `results.csv` with `args.yaml` / `opt.yaml` + `hyp.yaml`.

Read from: ultralytics/ultralytics `ultralytics/engine/trainer.py` (`BaseTrainer._do_train`: one row per
epoch through `save_metrics`, `epoch` = the 1-based epoch, then `train/*_loss` (the epoch's mean loss
items), `metrics/*`, `val/*_loss`, `lr/pg0..2`; `args.yaml` written at start with `epochs`, `patience`,
`lr0`, `lrf`, `cos_lr`; `EarlyStopping` stops when `epoch - best_epoch >= patience` with fitness
0.1 mAP50 + 0.9 mAP50-95; the LR follows `lr0 * lf(epoch)`, `lf` falling linearly (or by a cosine) from 1
to `lrf` at the last planned epoch, after a warmup of `warmup_epochs`). ultralytics/yolov5 `train.py`
(`results.csv`: 0-based `epoch`, `train/box_loss`, `train/obj_loss`, `train/cls_loss`, `metrics/*`,
`val/*`, `x/lr0..2`; `opt.yaml` with `epochs`, `patience`, `resume`, and `hyp.yaml`).
"""

from trainguard.ingest.formats import FormatContract, declare

_LR = ("after warmup every param group's LR is lr0 x lf(epoch), lf decaying from 1 to lrf (0.01 by default, "
       "at most 0.2 in the shipped hyps) at the last planned epoch: a decayed LR still above 90% of its peak "
       "is far from the plan's end")
_STOP = "EarlyStopping: a run ends before its plan when epoch - best_fitness_epoch >= patience"

declare(
    FormatContract(
        name="ultralytics results.csv", family="Ultralytics YOLO (v8+)",
        writer="ultralytics/ultralytics ultralytics/engine/trainer.py BaseTrainer.save_metrics, _do_train",
        files=("results.csv", "args.yaml"),
        metrics="train/box_loss, train/cls_loss, train/dfl_loss (parts of the epoch's mean loss); "
                "metrics/precision(B), recall(B), mAP50(B), mAP50-95(B); val/*_loss; lr/pg0..2",
        step_axis="epoch, 1-based; one row per epoch",
        plan="args.yaml beside it: epochs (and patience for early stopping)",
        completion="a row at the last planned epoch, or early stopping (patience epochs after the best "
                   "fitness, 0.1 mAP50 + 0.9 mAP50-95)",
        parts="sum", notes=(_LR, _STOP, "a resumed run continues the same file"),
        step_unit="epoch", plan_files=("args.yaml",), plan_keys=("epochs",), patience_keys=("patience",),
        parts_from=("train/",), lr_decays_only=True,
    ),
    FormatContract(
        name="yolov5 results.csv", family="YOLOv5",
        writer="ultralytics/yolov5 train.py (results.csv via utils/loggers/__init__.py Loggers.on_fit_epoch_end)",
        files=("results.csv", "opt.yaml", "hyp.yaml"),
        metrics="train/box_loss, train/obj_loss, train/cls_loss; metrics/precision, recall, mAP_0.5, "
                "mAP_0.5:0.95; val/*_loss; x/lr0..2 (padded with spaces)",
        step_axis="epoch, 0-based; one row per epoch",
        plan="opt.yaml beside it: epochs, patience (hyp.yaml: lr0, lrf)",
        completion="a row at the last planned epoch (epochs - 1), or early stopping",
        parts="sum", notes=(_LR, _STOP, "opt.yaml `resume: true` continues a run into the same folder"),
        step_unit="epoch", plan_files=("opt.yaml",), plan_keys=("epochs",), patience_keys=("patience",),
        parts_from=("train/",), lr_decays_only=True,
    ),
)
