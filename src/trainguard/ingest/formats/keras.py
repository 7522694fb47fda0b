"""Keras' `CSVLogger` callback: one row per epoch.

Read from: keras-team/keras `keras/src/callbacks/csv_logger.py` (`on_epoch_end`: `epoch` then the
epoch's logs sorted by name: `loss`, each output's `<output>_loss` for a multi-output model, metrics,
`val_*`, and `learning_rate` / `lr` when a callback puts it in the logs; `append=True` continues a file).
"""

from trainguard.ingest.formats import FormatContract, declare

declare(
    FormatContract(
        name="keras csvlogger", family="Keras",
        writer="keras-team/keras keras/src/callbacks/csv_logger.py CSVLogger.on_epoch_end",
        files=("*.csv",),
        metrics="loss, <output>_loss per head, metrics (accuracy...), val_*, lr / learning_rate",
        step_axis="epoch, 0-based; one row per epoch",
        plan="none (epochs and EarlyStopping live in the script)",
        completion="none",
        parts="independent",
        notes=("`loss` = sum of loss_weights[k] x <k>_loss plus regularisation: the weights are not written, so "
               "the heads' losses cannot be checked against the total",
               "`append=True` over several `fit` calls writes each fit's epochs from 0 again, with no second "
               "header: a row back at the first epoch begins another launch, and the file is judged on its last "
               "fit that trains",),
        step_unit="epoch",
    ),
    FormatContract(
        name="keras history csv", family="Keras",
        writer="keras-team/keras keras/src/callbacks/history.py History.on_epoch_end (appends each epoch's logs to "
               "history.history), saved by the script as a table (pandas DataFrame(history.history).to_csv)",
        files=("*.csv",),
        metrics="loss, metrics, and each `val_<metric>` beside its `<metric>`; lr / learning_rate when a callback "
                "logs it",
        step_axis="no epoch column: the row's index is its epoch, 0-based, one row per epoch",
        plan="none (epochs and EarlyStopping live in the script)",
        completion="none",
        parts="independent",
        notes=("told from any other table by its columns: a `loss`, and every `val_*` column paired with its "
               "training twin; a leading unnamed column is pandas' index",),
        step_unit="epoch",
    ),
)
