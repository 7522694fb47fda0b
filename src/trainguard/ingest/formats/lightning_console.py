"""Lightning's console: the progress bar's postfix, and the messages of its callbacks (EarlyStopping's
improvements and its stop, the fit loop's `max_epochs` stop), printed by rank 0."""

from trainguard.ingest.formats import FormatContract
from trainguard.ingest.formats._text import TextRules, declare_text

declare_text(
    FormatContract(
        name="lightning console",
        family="PyTorch Lightning",
        writer="Lightning-AI/pytorch-lightning src/lightning/pytorch/callbacks/early_stopping.py "
               "(_improvement_message, _evaluate_stopping_criteria), loops/fit_loop.py (the max_epochs stop), "
               "callbacks/progress/tqdm_progress.py",
        files=("*.out", "*.err", "*.log"),
        metrics="the bar's postfix `loss=..., v_num=...`; EarlyStopping: 'Metric val_loss improved by 0.003 >= "
                "min_delta = 0.0. New best score: 0.021' (the monitored metric's new best, 3 decimals)",
        step_axis="the training bar's count restarts each epoch; the validation bar counts evaluation batches",
        plan="'`Trainer.fit` stopped: `max_epochs=500` reached.' names it at the end",
        completion="'`Trainer.fit` stopped: ...' or EarlyStopping's 'Monitored metric X did not improve in the last "
                   "N records. Best score: B. Signaling Trainer to stop.' (a planned stop)",
        parts="independent",
        notes=("EarlyStopping prints only improvements, rounded: equal printed values are not a frozen metric",
               "'Monitored metric X = nan is not finite' is a stop on a non-finite metric, not a completion"),
    ),
    TextRules(
        format="lightning console",
        completion=(r"`Trainer\.fit` stopped", r"Monitored metric \S+ did not improve in the last \d+ records",
                    r"Stopping threshold reached:"),
        sample=("Metric val_loss improved. New best score: {val}",
                "Metric val_loss improved by 0.004 >= min_delta = 0.0. New best score: {val}",
                "Monitored metric val_loss did not improve in the last 5 records. Best score: {val}. "
                "Signaling Trainer to stop."),
    ),
)
