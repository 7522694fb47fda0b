"""Trains a tiny YOLO detector with the real Ultralytics library on the CPU, offline, watched by trainguard.

    python tests/integrations/ultralytics_train.py [--plant none|lr-zero|nan|frozen|stuck-worker] [--epochs N]

It writes a small detection dataset (64x64 images with red and blue boxes, YOLO label files and a
data.yaml) and a small model yaml into the current folder, builds the model from that yaml (no weights
to download), attaches trainguard (`attach(model)`) and trains with `plots=False` and `amp=False`, so
Ultralytics neither fetches fonts nor runs its AMP check. Run with YOLO_OFFLINE=1 and YOLO_CONFIG_DIR set.
Each plant is a mistake made with Ultralytics' own extension points (a trainer subclass, a callback):

- lr-zero: a trainer whose schedule is sized for a third of the epochs, so the LR is 0 from then on;
- nan: one weight of the first convolution is set to NaN at the start of epoch 3 (Ultralytics' NaN
  recovery then reloads last.pt and trains on);
- frozen: the optimizer is built over a copy of the model, so its steps change none of the model's weights;
- stuck-worker: seed 003, an augmentation that, in the DataLoader worker, blocks for good once the
  first validation and checkpoint are done.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import torchvision_cpu_ops  # noqa: E402  before anything imports torchvision

torchvision_cpu_ops.install()

import torch  # noqa: E402
from PIL import Image  # noqa: E402
from ultralytics import YOLO  # noqa: E402
from ultralytics.models.yolo.detect import DetectionTrainer  # noqa: E402

from trainguard.integrations.ultralytics import attach  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--plant", default="none", choices=["none", "lr-zero", "nan", "frozen", "stuck-worker"])
p.add_argument("--epochs", type=int, default=6)
a = p.parse_args()
torch.set_num_threads(1)

MODEL_YAML = """\
# a small detector: three stride-2 convolutions, a C2f block, Ultralytics' Detect head on strides 8 and 16
nc: 2
backbone:
  - [-1, 1, Conv, [8, 3, 2]]
  - [-1, 1, Conv, [16, 3, 2]]
  - [-1, 1, Conv, [16, 3, 2]]
  - [-1, 1, C2f, [16, True]]
  - [-1, 1, Conv, [32, 3, 2]]
head:
  - [[3, 4], 1, Detect, [nc]]
"""


def write_dataset(root: Path, n: int = 32) -> Path:
    """n training and n/2 validation images, each with two boxes, red (class 0) or blue (class 1)."""
    rng = np.random.default_rng(0)
    for split, count in (("train", n), ("val", n // 2)):
        (root / "images" / split).mkdir(parents=True, exist_ok=True)
        (root / "labels" / split).mkdir(parents=True, exist_ok=True)
        for i in range(count):
            img = np.full((64, 64, 3), 200, np.uint8)
            lines = []
            for _ in range(2):
                c = int(rng.integers(2))
                w, h = (int(v) for v in rng.integers(14, 30, 2))
                x, y = int(rng.integers(0, 64 - w)), int(rng.integers(0, 64 - h))
                img[y:y + h, x:x + w] = (220, 30, 30) if c == 0 else (30, 30, 220)
                lines.append(f"{c} {(x + w / 2) / 64:.5f} {(y + h / 2) / 64:.5f} {w / 64:.5f} {h / 64:.5f}")
            Image.fromarray(img).save(root / "images" / split / f"{i}.png")
            (root / "labels" / split / f"{i}.txt").write_text("\n".join(lines) + "\n")
    data = root / "data.yaml"
    data.write_text(f"path: {root.resolve()}\ntrain: images/train\nval: images/val\nnames:\n  0: red\n  1: blue\n")
    return data


class ShortScheduleTrainer(DetectionTrainer):
    """lr-zero: a linear decay sized for a third of the epochs, then 0 (seed 002's schedule)."""

    def _setup_scheduler(self):
        horizon = max(1, self.epochs // 3)
        self.lf = lambda e: max(1 - e / horizon, 0.0)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda=self.lf)


class StaleCopyTrainer(DetectionTrainer):
    """frozen: the optimizer holds the parameters of a copy of the model, not of the model trained."""

    def build_optimizer(self, model, *args, **kwargs):
        return super().build_optimizer(copy.deepcopy(model), *args, **kwargs)


VALIDATED = Path("validated.flag")


class WaitAfterValidation:
    """stuck-worker: wraps the training augmentations; in the worker, once the main process has
    validated and saved a checkpoint, it waits for good (seed 003 hung right there)."""

    def __init__(self, transforms) -> None:
        self.transforms = transforms

    def __call__(self, sample):
        while VALIDATED.exists():
            time.sleep(1)
        return self.transforms(sample)


class StuckWorkerTrainer(DetectionTrainer):
    """Ultralytics loads data in the main process on a CPU (it sets workers=0); this trainer gives it back
    one DataLoader worker, as seed 003 had on its GPU, and wraps the training augmentations."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.args.workers = 1

    def build_dataset(self, img_path, mode="train", batch=None):
        dataset = super().build_dataset(img_path, mode, batch)
        if mode == "train":
            dataset.transforms = WaitAfterValidation(dataset.transforms)
        return dataset


def poison_first_conv(trainer) -> None:
    if trainer.epoch == 2 and not getattr(trainer, "_poisoned", False):
        trainer._poisoned = True
        with torch.no_grad():
            trainer.model.model[0].conv.weight[0, 0, 0, 0] = float("nan")


data = write_dataset(Path("dataset"))
Path("tiny.yaml").write_text(MODEL_YAML)
model = YOLO("tiny.yaml")
trainer = {"lr-zero": ShortScheduleTrainer, "frozen": StaleCopyTrainer, "stuck-worker": StuckWorkerTrainer}.get(
    a.plant, DetectionTrainer)
if a.plant == "nan":
    model.add_callback("on_train_epoch_start", poison_first_conv)
if a.plant == "stuck-worker":
    model.add_callback("on_model_save", lambda trainer: VALIDATED.touch())
attach(model)
model.train(trainer=trainer, data=str(data), epochs=a.epochs, imgsz=64, batch=4, nbs=4, device="cpu", plots=False, amp=False,
            optimizer="SGD", lr0=0.01, warmup_epochs=1, mosaic=0.0, close_mosaic=0, seed=0,
            project=str(Path("runs").resolve()), name="train", exist_ok=True, verbose=False)
print(f"ultralytics_train: nms calls {torchvision_cpu_ops.calls}")
print("Training complete")
