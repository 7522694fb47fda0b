"""OpenMMLab's mmengine: `vis_data/scalars.json` (+ the config `.py`) from `LocalVisBackend`.

Read from: open-mmlab/mmengine `mmengine/visualization/vis_backend.py` (`LocalVisBackend.add_scalars`:
one JSON object per line, `{..., "step": step}`; `add_config` dumps the whole config as `config.py` in
`vis_data`) and `mmengine/hooks/logger_hook.py` + `mmengine/runner/log_processor.py` (train rows carry
`lr`, `loss`, `loss_*`, `time`, `data_time`, `memory`, `epoch`, `iter` and `step` = the global iteration;
validation rows carry the metrics (`coco/AP`, `accuracy/top1`) with `step` = the epoch when the loop is
by epoch); `mmengine/runner/loops.py` (`EpochBasedTrainLoop(max_epochs, val_interval)`,
`IterBasedTrainLoop(max_iters)` from `train_cfg`).
"""

from trainguard.ingest.formats import FormatContract, declare

declare(
    FormatContract(
        name="mmengine scalars.json", family="OpenMMLab (mmengine: MMDetection, MMPose, MMPretrain ...)",
        writer="open-mmlab/mmengine mmengine/visualization/vis_backend.py LocalVisBackend; "
               "mmengine/runner/log_processor.py LogProcessor",
        files=("vis_data/scalars.json", "vis_data/config.py", "vis_data/*.py"),
        metrics="train rows: loss, loss_* (parts, summed by the model's parse_losses), lr, time; "
                "validation rows: the evaluator's metrics (coco/AP, accuracy/top1 ...)",
        step_axis="train rows: iter (global iterations; epoch beside it); validation rows: the epoch",
        plan="the config: train_cfg max_epochs (by epoch) or max_iters (by iteration)",
        completion="a train row in the last planned epoch (or at max_iters)",
        parts="sum",
        notes=("validation rows count their step in epochs, train rows in iterations",),
        step_unit="iteration", plan_files=("config.py", "*.py"),
        plan_keys=("train_cfg.max_epochs", "train_cfg.max_iters", "max_epochs", "max_iters"),
        parts_from=("loss_",),
        # mmdet's CrossEntropyLoss/FocalLoss heads (loss_cls), RPN objectness (sigmoid: binary), mmseg's
        # decode/auxiliary heads (loss_ce): each a mean over its samples
        cross_entropy=(("loss_cls", 0), ("loss_rpn_cls", 2), ("decode.loss_ce", 0), ("aux.loss_ce", 0)),
    ),
)
