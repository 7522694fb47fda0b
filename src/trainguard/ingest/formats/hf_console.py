"""Hugging Face Trainer's console: the dicts `Trainer.log` hands to `ProgressCallback.on_log`, printed
under (or glued to) the tqdm bar, the same dict behind any logging prefix (loguru, AutoTrain's
`INFO | ... on_log:226 - {...}`, `logger.info(logs)`), and the run summary printed before training.
"""

from trainguard.ingest.formats import FormatContract
from trainguard.ingest.formats._text import TextRules, declare_text

declare_text(
    FormatContract(
        name="hugging face console",
        family="Hugging Face Transformers",
        writer="huggingface/transformers src/transformers/trainer.py (Trainer.log, _inner_training_loop's "
               "'***** Running training *****' block) and trainer_callback.py (ProgressCallback.on_log)",
        files=("*.log", "*.out", "nohup.out"),
        metrics="{'loss', 'grad_norm', 'learning_rate', 'epoch'} per logging step; {'eval_*'} per evaluation; "
                "{'train_runtime', 'train_loss', ...} once at the end (a mean, not a step); Transformers 5 "
                "quotes the values",
        step_axis="the dict has no step: the tqdm bar drawn with it counts optimizer steps (global_step); "
                  "without a bar, each dict is the next logging step",
        plan="'  Num Epochs = 3' and '  Total optimization steps = 14,007' in the run summary; the bar's /N",
        completion="the closing {'train_runtime': ...} dict",
        parts="none",
        notes=("epoch is a float rounded to 2 decimals, a position, not a metric",),
    ),
    TextRules(
        format="hugging face console",
        completion=(r"['\"]train_runtime['\"]", r"\*+ train metrics \*+"),
        plan_steps=("total optimization steps",),
        plan_epochs=("num epochs",),
        sample=("{{'loss': {loss}, 'grad_norm': 1.25, 'learning_rate': 5e-05, 'epoch': 0.1}}",
                "{{'eval_loss': {val}, 'eval_runtime': 1.5, 'epoch': 1.0}}"),
    ),
)
