"""Keras's console: 'Epoch E/N' then the progress bar's last state, `- loss: X - val_loss: Y`."""

from trainguard.ingest.formats import FormatContract
from trainguard.ingest.formats._text import TextRules, declare_text

declare_text(
    FormatContract(
        name="keras console",
        family="Keras",
        writer="keras-team/keras keras/src/callbacks/progbar_logger.py and utils/progbar.py ('Epoch %d/%d', "
               "'N/N ━━━━ 5s 3ms/step - accuracy: 0.91 - loss: 0.29 - val_accuracy: ... - val_loss: ...')",
        files=("*.log", "*.out"),
        metrics="`loss`, `accuracy`, `val_*` after ` - `; the bar's `N/N` counts batches in the epoch",
        step_axis="epochs (the bar's count restarts each epoch); one row per epoch's end",
        plan="the `/N` of 'Epoch E/N'",
        completion="the last epoch's line (E = N), or EarlyStopping's 'Epoch E: early stopping'",
        parts="none",
    ),
    TextRules(
        format="keras console",
        completion=(r"epoch \d+: early stopping",),
        sample=("Epoch {epoch}/{epochs}",
                "1875/1875 - 5s - 3ms/step - accuracy: 0.9100 - loss: {loss} - val_accuracy: 0.9500 - val_loss: {val}"),
    ),
)
