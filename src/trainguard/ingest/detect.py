"""What a PATH is, and the reader for it: a log, an output folder, a metrics file, TensorBoard files.

A folder is searched in this order: Hugging Face (`trainer_state.json`, `checkpoint-N/`), Lightning
(`lightning_logs/version_N/metrics.csv`, newest version), `metrics.csv`, Ultralytics `results.csv`, YOLOv7 `results.txt`,
mmengine `vis_data/scalars.json`, LLaMA-Factory's `trainer_log.jsonl`, ms-swift's `logging.jsonl`, a W&B run folder (`files/wandb-summary.json`), TensorBoard event files,
then a log (`output.log`, `*.log`, `*.txt`). Anything else is refused with one
line naming what was looked for.
"""

from __future__ import annotations

import re
from pathlib import Path

from trainguard.errors import UserError
from trainguard.ingest.events import Source
from trainguard.untrusted import regular_file

LOG_NAMES = ("output.log", "train.log", "stdout.log", "log.txt", "stdout.txt")
_VERSION = re.compile(r"^version_(\d+)$")


def open_source(path: str | Path) -> Source:
    p = Path(path)
    try:
        if not p.exists():
            raise UserError(f"{p}: no such file or folder")
        return _open_dir(p) if p.is_dir() else _open_file(regular_file(p))
    except PermissionError as exc:
        raise UserError(f"cannot read {p}: {exc.strerror}") from None
    except IsADirectoryError as exc:
        raise UserError(f"cannot read {p}: {exc.strerror}") from None


def _open_file(p: Path) -> Source:
    from trainguard.ingest import hf, tables, tensorboard, textlog

    name = p.name.lower()
    if name == "trainer_state.json":
        return hf.read_trainer_state(p, p.parent.parent if p.parent.name.startswith("checkpoint-") else p.parent)
    if name.startswith("events.out.tfevents."):
        return tensorboard.read_tensorboard([p])
    if name == "results.txt":
        from trainguard.ingest import yolotxt

        if yolotxt.looks_like(p):  # YOLOv7's per-epoch table (any other results.txt is read as a log)
            return yolotxt.read_results_txt(p)
    if name.endswith(".tsv"):
        return tables.read_csv(p, "tab-separated table", "\t")
    if name.endswith(".csv"):
        fmt = {"results.csv": "ultralytics results.csv", "metrics.csv": "lightning metrics.csv"}.get(name, "csv")
        return tables.read_csv(p, fmt)
    if name.endswith((".jsonl", ".ndjson")):
        return tables.read_jsonl(p)
    if name.endswith(".json"):
        with open(p, "rb") as f:
            head = f.read(4096)
        if b'"log_history"' in head or b'"max_steps"' in head or b'"global_step"' in head:
            return hf.read_trainer_state(p)
        return tables.read_jsonl(p)
    delimiter = tables.sniff_table(p)
    if delimiter is not None:  # a `step<TAB>loss` table saved as train.log
        return tables.read_csv(p, "tab-separated table" if delimiter == "\t" else "csv", delimiter)
    return textlog.read_text_log(p)


def _open_dir(p: Path) -> Source:
    from trainguard.ingest import hf, tables, tensorboard, textlog, wandb

    state = hf.find_state(p)
    if state is not None:
        return hf.read_trainer_state(state, p)
    version = newest_lightning_version(p)
    if version is not None:
        if (version / "metrics.csv").is_file():
            return tables.read_csv(version / "metrics.csv", "lightning metrics.csv")
        files = tensorboard.event_files(version)
        if files:
            return tensorboard.read_tensorboard(files)
    for name, fmt in (("metrics.csv", "lightning metrics.csv"), ("results.csv", "ultralytics results.csv")):
        if (p / name).is_file():
            return tables.read_csv(p / name, fmt)
    if (p / "results.txt").is_file():  # YOLOv7's per-epoch table, when it is one
        from trainguard.ingest import yolotxt

        if yolotxt.looks_like(p / "results.txt"):
            return yolotxt.read_results_txt(p / "results.txt")
    for scalars in (p / "scalars.json", p / "vis_data" / "scalars.json"):  # mmengine's LocalVisBackend
        if scalars.is_file():
            return tables.read_jsonl(scalars)
    # LLaMA-Factory's output_dir (LogCallback's trainer_log.jsonl beside all_results.json) and ms-swift's
    # (logging.jsonl): the trainer_state.json they may also hold was taken above
    for name in ("trainer_log.jsonl", "logging.jsonl"):
        if (p / name).is_file():
            return tables.read_jsonl(p / name)
    run = wandb.run_folder(p)
    if run is not None:
        return wandb.read_run(run)
    if (p / "metrics.json").is_file():  # detectron2's OUTPUT_DIR: JSONWriter's metrics.json beside its events
        return tables.read_jsonl(p / "metrics.json")
    files = tensorboard.event_files(p)
    if files:
        return tensorboard.read_tensorboard(files)
    for name in LOG_NAMES:
        if (p / name).is_file():
            return textlog.read_text_log(p / name)
    logs = sorted(q for q in p.iterdir() if q.is_file() and q.suffix in (".log", ".txt"))
    if len(logs) == 1:
        return textlog.read_text_log(logs[0])
    raise UserError(f"{p}: nothing trainguard can read here (looked for trainer_state.json, lightning_logs/, "
                    "metrics.csv, results.csv, vis_data/scalars.json, trainer_log.jsonl, logging.jsonl, a W&B run folder, "
                    "metrics.json, TensorBoard event files, "
                    "output.log or one *.log, slurm-*.out / *.err)")


def newest_lightning_version(p: Path) -> Path | None:
    """`lightning_logs/version_N` (or `version_N` itself) with the highest N, if any."""
    if _VERSION.match(p.name):
        return p
    base = p / "lightning_logs" if (p / "lightning_logs").is_dir() else p
    versions = [(int(m.group(1)), q) for q in base.iterdir() if q.is_dir() and (m := _VERSION.match(q.name))]
    return max(versions)[1] if versions else None
