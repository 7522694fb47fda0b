"""The format families, imported by name: importing this module declares every contract (`FORMATS`).
A new format family is a module in this package and its line here."""

from __future__ import annotations

from trainguard.ingest.formats import (  # noqa: F401
    cyclegan,
    deepspeed,
    detectron2,
    detectron2_console,
    fairseq,
    generic,
    generic_text,
    hf_console,
    huggingface,
    improved_diffusion,
    keras,
    keras_console,
    lerobot,
    lightning,
    lightning_console,
    llmc,
    megatron,
    mmcv,
    mmengine,
    mmengine_console,
    nanogpt,
    olmo,
    pytorch_examples,
    ssl_console,
    theano_tutorials,
    timm,
    timm_console,
    ultralytics,
    wandb,
    wandb_console,
    yolov7,
)
