"""TensorBoard event files (`events.out.tfevents.*`), read record by record with TensorBoard's own loader.

Scalars logged at the same step (`train/loss`, `lr-AdamW`, `val/loss`...) are merged into one step
row and one eval event. A folder with several event files (a run restarted, train and val writers) is
read file after file, in name order (the file name starts with its creation time).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trainguard.errors import UserError
from trainguard.ingest.events import Facts, Source, metrics_to_events, sniff_binary_ok

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
    return Source(path=paths[0], format="tensorboard event files", events=_events(paths, facts), facts=facts)


def _events(paths: list[Path], facts: Facts) -> Iterator[dict[str, Any]]:
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
                    yield from metrics_to_events(current, merged, facts)
                    merged = {}
                current = step
                for value in ev.summary.value:
                    number = _scalar(value)
                    if number is not None:
                        merged[value.tag] = number
        except Exception:  # a truncated or damaged file: keep what was read before the damage
            facts.skipped += 1
    if current is not None:
        yield from metrics_to_events(current, merged, facts)


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
