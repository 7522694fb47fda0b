"""detectron2's console and log.txt: the full config printed first, CommonMetricPrinter's lines, the
evaluator's tables, and IterationTimer's closing lines (Mask2Former, DETR-style projects print the same)."""

from trainguard.ingest.formats import FormatContract
from trainguard.ingest.formats._text import TextRules, declare_text

declare_text(
    FormatContract(
        name="detectron2 console",
        family="detectron2",
        writer="facebookresearch/detectron2 detectron2/utils/events.py (CommonMetricPrinter.write: ' {eta}iter: "
               "{iter}  {losses}  ... lr: {lr}  {memory}'), engine/hooks.py (IterationTimer.after_train: 'Overall "
               "training speed: N iterations in ...', 'Total training time: ...'), engine/defaults.py (the "
               "'Running with full config:' dump)",
        files=("log.txt", "output-log.txt", "*.log"),
        metrics="`total_loss` and each `loss_*` (each a median over the last 20 iterations, printed already "
                "multiplied by its weight), `lr`; evaluation tables and `copypaste:` lines",
        step_axis="iterations (optimizer steps), 0-based: the last is MAX_ITER - 1",
        plan="SOLVER.MAX_ITER in the config dump",
        completion="'Overall training speed: N iterations' after the last iteration (also printed before an "
                   "exception's traceback, which then decides)",
        parts="median",
        notes=("the config dump's EVAL_PERIOD: 200 is a setting, not an evaluation",
               "parts are medians of their own windows: they never sum exactly to total_loss",
               "relaunches append to the same log.txt (resume=True continues the iteration count)"),
    ),
    TextRules(
        format="detectron2 console",
        completion=(r"overall training speed: \d+ iterations", r"\btotal training time:"),
        plan_steps=("max_iter",),
        not_evaluation=(r"^\s*[A-Z_]+_PERIOD\s*:",),
        weighted_parts=r"\biter: \d+\s+total_loss: ",
        sample=("[08/30 23:14:25] d2.utils.events INFO:  eta: 0:00:34  iter: {step}  total_loss: {loss}  "
                "loss_cls: 0.5  loss_box_reg: 0.25  lr: 0.0025  max_mem: 5000M",),
    ),
)
