"""mmcv 1.x's runner logs (OpenMMLab before mmengine): `<timestamp>.log.json`."""

from trainguard.ingest.formats import FormatContract, declare

declare(
    FormatContract(
        name="mmcv log.json", family="mmcv 1.x (OpenMMLab)",
        writer="open-mmlab/mmcv 1.x mmcv/runner/hooks/logger/text.py TextLoggerHook (before_run dumps runner.meta; "
               "log() builds OrderedDict(mode, epoch, iter) + lr, memory, log_buffer.output; _dump_log appends one "
               "JSON object per line, floats rounded to 5 decimals)",
        files=("*.log.json",),
        metrics="train records: loss and its parts (loss_cls, loss_bbox, ...), lr (first param group), time, "
                "data_time, memory; `mode: val` records: the evaluation's metrics (bbox_mAP, accuracy_top-1, mIoU)",
        step_axis="EpochBasedRunner: `iter` counts within the epoch (inner_iter + 1); the global step is "
                  "(epoch - 1) x iterations per epoch + iter; IterBasedRunner: `iter` is the global iteration",
        plan="the first record's `config` text: `runner = dict(type='EpochBasedRunner', max_epochs=12)` / "
             "`max_iters=N`, or the older `total_epochs = N`",
        completion="a record of the last planned epoch that closes it (its last iteration or its evaluation); "
                   "the planned iteration reached",
        parts="sum",
        notes=("the first record is the runner's meta (env_info, config, seed, exp_name), not metrics",
               "a validation record's `iter` is the evaluation's length (eval_iter_num), not a training step"),
        plan_keys=("runner.max_epochs", "runner.max_iters", "total_epochs"),
        # mmdet's CrossEntropyLoss/FocalLoss heads (loss_cls), RPN objectness (sigmoid: binary), mmseg's
        # decode/auxiliary heads (loss_ce): each a mean over its samples
        cross_entropy=(("loss_cls", 0), ("loss_rpn_cls", 2), ("decode.loss_ce", 0), ("aux.loss_ce", 0)),
    ),
)
