"""The format families, imported by name: importing this module declares every contract (`FORMATS`)."""

from __future__ import annotations

from trainguard.ingest.formats import (  # noqa: F401
    detectron2,
    generic,
    huggingface,
    keras,
    lightning,
    mmengine,
    timm,
    ultralytics,
    wandb,
)
