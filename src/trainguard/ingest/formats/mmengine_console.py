"""OpenMMLab's MMEngine console: the config printed first, LoggerHook's lines, and the evaluator's."""

from trainguard.ingest.formats import FormatContract
from trainguard.ingest.formats._text import TextRules, declare_text

declare_text(
    FormatContract(
        name="mmengine console",
        family="OpenMMLab MMEngine",
        writer="open-mmlab/mmengine mmengine/runner/log_processor.py (get_log_after_iter: 'Epoch(train) "
               "[{epoch}][{iter}/{len}]  lr: ...  eta: ...  time: ...  loss: ...  loss_cls: ...' or 'Iter(train) "
               "[{iter}/{max_iters}]'; get_log_after_epoch: 'Epoch(val) [{epoch}][{len}/{len}]  accuracy/top1: ...')",
        files=("*.log",),
        metrics="`loss` and `loss_*` parts (the sum), `lr`, `grad_norm`; `Epoch(val)` lines are evaluations",
        step_axis="Iter(train) [i/N] counts optimizer steps; Epoch(train) [e][i/n] restarts each epoch",
        plan="`max_epochs`/`max_iters` of train_cfg in the config dump; the `/N` of Iter(train)",
        completion="the last planned epoch's or iteration's validation",
        parts="sum",
        notes=("`Epoch(val) [1][5/5]` progress counts evaluation batches, not steps",),
    ),
    TextRules(
        format="mmengine console",
        plan_steps=("max_iters",),
        plan_epochs=("max_epochs",),
        sample=("Epoch(train)  [{epoch}][{batch}/{batches}]  lr: 1.0000e-02  eta: 0:10:00  time: 0.2500  "
                "loss: {loss}  loss_cls: 0.5000",),
    ),
)
