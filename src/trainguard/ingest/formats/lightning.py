"""PyTorch Lightning's own loggers: CSVLogger's `metrics.csv` + `hparams.yaml`, and TensorBoardLogger.

Read from: Lightning-AI/pytorch-lightning `src/lightning/fabric/loggers/csv_logs.py` (`_ExperimentWriter`:
one row per `log_metrics` call, `step` column, the union of all keys as the header, rewritten when a new
key appears; `save_dir/name/version_N/metrics.csv`) and `src/lightning/pytorch/loggers/csv_logs.py`
(`hparams.yaml` beside it); `src/lightning/pytorch/trainer/connectors/logger_connector` (an `epoch` column,
`*_step` / `*_epoch` suffixes for `self.log(on_step=True, on_epoch=True)`, epoch-end rows written when an
epoch closes).
"""

from trainguard.ingest.formats import FormatContract, declare

declare(
    FormatContract(
        name="lightning metrics.csv", family="PyTorch Lightning",
        writer="Lightning-AI/pytorch-lightning src/lightning/fabric/loggers/csv_logs.py _ExperimentWriter; "
               "src/lightning/pytorch/loggers/csv_logs.py CSVLogger",
        files=("lightning_logs/version_*/metrics.csv", "version_*/metrics.csv", "metrics.csv"),
        metrics="whatever the module logs: train_loss(_step/_epoch), val_*, lr-<Optimizer>; sparse rows, "
                "train and validation of one step on separate rows",
        step_axis="step = trainer.global_step (optimizer updates); epoch column beside it",
        plan="hparams.yaml beside it (max_epochs / epochs, if the module saved them)",
        completion="test_* rows after the last epoch (trainer.test() ran: fit() returned), or the last planned "
                   "epoch closed; an epoch-end row alone is no end (CSVLogger flushes at intervals: a kill leaves one)",
        parts="independent",
        notes=("a metric logged on_epoch only appears on the epoch-end row, at the last step of the epoch",
               "`*_loss` columns beside a `loss`/`mean_loss` total are parts; with no total at all, the mean"
               " of the parts does not stand for one",
               "a loss logged on_epoch only (`train_loss_epoch`, no step-level loss column) is the run's loss "
               "curve, one row per epoch"),
        plan_files=("hparams.yaml",), plan_keys=("max_epochs", "num_epochs", "epochs", "n_epochs"),
        step_unit="optimizer-step",
    ),
    FormatContract(
        name="tensorboard event files", family="TensorBoard (Lightning, Ultralytics, HF, YOLOv5 ...)",
        writer="tensorflow/tensorboard tensorboard/summary/writer/event_file_writer.py; torch.utils.tensorboard",
        files=("events.out.tfevents.*",),
        metrics="scalars by tag: train/loss, lr-*, val/*; Ultralytics train/box_loss, metrics/mAP50(B), lr/pg0",
        step_axis="the step each scalar was added at (optimizer updates for Lightning/HF, epochs for Ultralytics)",
        plan="none in the events",
        completion="none",
        parts="independent",
        notes=("several files in one folder: a restart or separate train/val writers, read in name order",),
    ),
)
