"""Writes results.csv + opt.yaml: a YOLOv5 run whose LR schedule started over halfway.

    python make_log.py            # in this folder; --healthy writes the twin (a resume that continues)

YOLOv5's train.py sets every param group's LR to lr0 x lf(epoch), lf falling linearly from 1 to lrf after
a warm-up, and writes one results.csv row per epoch (x/lr0..x/lr2 are the groups' LRs). A run resumed
into the same folder with a freshly built optimizer and scheduler (`--weights last.pt` instead of
`--resume`) starts lf again at 1: the LR jumps back to lr0 long after its decay began.
"""
import math
import sys

healthy = "--healthy" in sys.argv
epochs, restart = 60, 34
cols = ["epoch", "train/box_loss", "train/obj_loss", "train/cls_loss", "metrics/precision", "metrics/recall",
        "metrics/mAP_0.5", "metrics/mAP_0.5:0.95", "val/box_loss", "val/obj_loss", "val/cls_loss",
        "x/lr0", "x/lr1", "x/lr2"]


def lf(e: int, total: int, lrf: float = 0.01) -> float:
    return (1 - e / total) * (1.0 - lrf) + lrf


rows = [",".join(f"{c:>20}" for c in cols)]
for e in range(epochs):
    lr = 0.01 * (lf(e, epochs) if healthy or e < restart else lf(e - restart, epochs))
    m = 0.62 * (1 - math.exp(-e / 12))
    values = [e, 0.09 * math.exp(-e / 40) + 0.02, 0.03, 0.012 * math.exp(-e / 30), m + 0.15, m, m, m * 0.55,
              0.06 * math.exp(-e / 50) + 0.02, 0.03 * math.exp(-e / 45) + 0.01, 0.006 * math.exp(-e / 35) + 0.001, lr, lr, lr]
    rows.append(",".join(f"{v:>20.5g}" if isinstance(v, float) else f"{v:>20}" for v in values))
with open("results.csv", "w") as f:
    f.write("\n".join(rows) + "\n")
with open("opt.yaml", "w") as f:
    f.write(f"weights: yolov5s.pt\ncfg: ''\ndata: data.yaml\nhyp:\n  lr0: 0.01\n  lrf: 0.01\nepochs: {epochs}\n"
            "batch_size: 16\nimgsz: 640\nresume: false\npatience: 100\nsave_dir: runs/train/exp\n")
