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
               "the heads' losses cannot be checked against the total",),
        step_unit="epoch",
    ),
)
