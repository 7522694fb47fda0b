"""TensorBoard event files (`events.out.tfevents.*`), read record by record with TensorBoard's own loader.

Scalars logged at the same step (`train/loss`, `lr-AdamW`, `val/loss`...) are merged into one step
row and one eval event. A folder with several event files (a run restarted, train and val writers) is
read file after file, in name order (the file name starts with its creation time), as one run: TensorBoard's
`DirectoryWatcher` reads a directory so. A later file that logs a tag again from an earlier step is a
restart (TensorBoard lets it replace the later steps): the run is judged from that launch on.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trainguard.errors import UserError
from trainguard.ingest.events import (
    LOSS_NAMES,
    Facts,
    Source,
    launch_event,
    metrics_to_events,
    sniff_binary_ok,
)

PATTERN = "events.out.tfevents.*"


def event_files(folder: Path) -> list[Path]:
    return sorted((p for p in folder.rglob(PATTERN) if p.is_file()), key=lambda p: p.name)


def read_tensorboard(paths: list[Path]) -> Source:
    try:
        from tensorboard.backend.event_processing.event_file_loader import EventFileLoader  # noqa: F401
    except ImportError:
        raise UserError("reading TensorBoard files needs the `tensorboard` package (pip install tensorboard)") from None
    for p in paths:
        sniff_binary_ok(p)
    facts = Facts(mtime=max(p.stat().st_mtime for p in paths))
    beside = _epoch_table_contract(paths[0].parent)
    if beside is not None:
        return _per_epoch(paths, facts, beside)
    plan: dict[str, Any] = {}
    if _yolo_tags(paths[0]):
        plan["lr_decays_only"] = True  # the YOLO writers' schedule: lr0 x lf(epoch), only decaying after warm-up
    return Source(path=paths[0], format="tensorboard event files", events=_events(paths, facts), facts=facts,
                  plan=plan)


YOLO_LR_TAGS = ("x/lr0", "lr/pg0")  # YOLOv5's and Ultralytics' TensorBoard callbacks (the LR of param group 0)
PEEK_RECORDS = 200


def _yolo_tags(path: Path) -> bool:
    """Whether the first records of an event file are a YOLO writer's: its LR tag beside `metrics/mAP...`."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    tags: set[str] = set()
    try:
        for i, ev in enumerate(EventFileLoader(str(path)).Load()):
            if i >= PEEK_RECORDS:
                break
            if ev.HasField("summary"):
                tags.update(v.tag for v in ev.summary.value)
    except Exception:  # a damaged file: the full read reports it
        return False
    return any(t in tags for t in YOLO_LR_TAGS) and any(t.startswith("metrics/mAP") for t in tags)


def _epoch_table_contract(folder: Path) -> Any:
    """The one-row-per-epoch writer (Ultralytics, YOLOv5) whose plan file sits beside these event files: its
    TensorBoard callback logs the same values as its results.csv, at the epoch as the step."""
    from trainguard.ingest import formats

    for name in ("ultralytics results.csv", "yolov5 results.csv"):
        c = formats.contract(name)
        if c is not None and any((folder / f).is_file() for f in c.plan_files):
            return c
    return None


def _per_epoch(paths: list[Path], facts: Facts, contract: Any) -> Source:
    """Event files of an Ultralytics or YOLOv5 run folder, read as its results.csv would be (`tables`): the
    step is the epoch, `train/*_loss` are the loss parts, and the plan file beside them says how the run
    ended against its planned epochs (and patience). Per-batch values logged at the epoch's step merge
    into that epoch's row (its last value each)."""
    from trainguard.ingest import epochend, tables
    from trainguard.ingest.plans import read_plan

    stated = read_plan(paths[0].parent, contract)
    rows = ({"epoch": step, **values} for step, values in _steps(paths, facts))
    judged = epochend.judge(rows, "epoch", facts, stated, lr_schedule=True)
    plan: dict[str, Any] = {"parts_relation": contract.parts, "step_unit": "epoch",
                            "lr_decays_only": contract.lr_decays_only}
    if stated.length:
        plan["total_steps"] = stated.length
    return Source(path=paths[0], format="tensorboard event files", facts=facts, plan=plan, log_like=True,
                  events=tables.merged(judged, "epoch", facts, contract.parts_from))


def _events(paths: list[Path], facts: Facts) -> Iterator[dict[str, Any]]:
    # the furthest step each tag reached in the files of each directory read so far: a later file of the same
    # directory that logs a tag at an earlier step is a restart (a writer reopened on the same log dir), whose
    # steps TensorBoard's loader lets replace the later ones (`purge_orphaned_data`, by tag): the run is judged
    # from that launch on, as a log with a relaunch appended is
    reached: dict[tuple[Path, str], int] = {}
    for i, path in enumerate(paths):
        deciding = i > 0 and any(d == path.parent for d, _ in reached)
        for step, merged in _steps([path], facts):
            if deciding and (shared := [t for t in merged if (path.parent, t) in reached]):
                deciding = False
                if any(step < reached[(path.parent, t)] for t in shared):
                    yield launch_event(step, f"{path.name} logs {shared[0]} again from step {step}")
            for tag in merged:
                reached[(path.parent, tag)] = max(step, reached.get((path.parent, tag), step))
            # Ultralytics' and YOLOv5's callbacks log no total, only `train/box_loss`, `train/cls_loss`...: the
            # parts, whose sum is the loss they train on (without their plan file beside: a lone event file)
            yield from metrics_to_events(step, merged, facts, parts_from=_parts_without_total(tuple(merged)))


@functools.lru_cache(maxsize=64)
def _parts_without_total(tags: tuple[str, ...]) -> tuple[str, ...]:
    """("_loss",) when the step's training tags are only loss parts and no total (`train/box_loss`,
    `train/cls_loss`, `train/dfl_loss`): a Hugging Face run's closing `train/train_loss` beside its
    `train/train_runtime` is no part."""
    train = [t for t in tags if t.startswith("train/")]
    if any(t.lower() in LOSS_NAMES for t in tags) or len(train) < 2:
        return ()
    return ("_loss",) if all(t.endswith("_loss") for t in train) else ()


def _steps(paths: list[Path], facts: Facts) -> Iterator[tuple[int, dict[str, float]]]:
    """(step, its scalars) in the order written, the scalars of consecutive records at one step merged."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    # TensorBoard logs a warning per damaged record; the count goes in `facts.skipped` instead.
    logging.getLogger("tensorboard").setLevel(logging.ERROR)
    current: int | None = None
    merged: dict[str, float] = {}
    for path in paths:
        try:
            for ev in EventFileLoader(str(path)).Load():
                facts.lines += 1
                if not ev.HasField("summary"):
                    continue
                step = int(ev.step)
                if current is not None and step != current:
                    yield current, merged
                    merged = {}
                current = step
                for value in ev.summary.value:
                    number = _scalar(value)
                    if number is not None:
                        merged[value.tag] = number
        except Exception:  # a truncated or damaged file: keep what was read before the damage
            facts.skipped += 1
    if current is not None:
        yield current, merged


def _scalar(value: Any) -> float | None:
    kind = value.WhichOneof("value")
    if kind == "simple_value":
        return float(value.simple_value)
    if kind == "tensor":
        from tensorboard.util import tensor_util

        try:
            array = tensor_util.make_ndarray(value.tensor)
        except Exception:
            return None
        return float(array.reshape(-1)[0]) if array.size == 1 and array.dtype.kind in "fiu" else None
    return None
