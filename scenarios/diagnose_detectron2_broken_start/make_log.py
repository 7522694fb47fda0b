"""Writes metrics.json: a detectron2 Faster R-CNN run whose first losses are far above any uniform guess.

    python make_log.py            # in this folder; --healthy writes the twin (a sane start)

detectron2's CommonMetricPrinter/JSONWriter write one JSON line every 20 iterations: `iteration`, `lr`,
`total_loss` and its parts. `loss_cls` is a mean cross-entropy over NUM_CLASSES + 1 classes and
`loss_rpn_cls` a mean binary cross-entropy: a freshly initialised head starts near ln(C + 1) and ln(2).
A start of 40 while the LR is still in its warm-up (the updates are too small to have raised it) means
the losses are not what they seem: labels out of range, boxes in the wrong units, weights that are not
the head's.
"""
import json
import math
import random
import sys

healthy = "--healthy" in sys.argv
random.seed(3)
max_iter, base_lr = 1500, 0.00025
first = ({"loss_cls": 1.1, "loss_box_reg": 0.8, "loss_rpn_cls": 0.69, "loss_rpn_loc": 0.35} if healthy else
         {"loss_cls": 41.0, "loss_box_reg": 9.5, "loss_rpn_cls": 17.0, "loss_rpn_loc": 12.0})
floor = {"loss_cls": 0.12, "loss_box_reg": 0.18, "loss_rpn_cls": 0.02, "loss_rpn_loc": 0.04}
lines = []
for it in range(19, max_iter, 20):
    fade = math.exp(-it / 150)
    parts = {k: round(v * fade + floor[k] * (1 - fade) * random.uniform(0.9, 1.1), 5) for k, v in first.items()}
    lr = base_lr * (0.001 + 0.999 * min(1.0, it / 1000))
    lines.append({"data_time": 0.004, "eta_seconds": round(0.45 * (max_iter - 1 - it), 1),
                  "fast_rcnn/cls_accuracy": round(0.6 + 0.35 * (1 - fade), 4), "iteration": it, **parts,
                  "lr": lr, "rank_data_time": 0.004, "time": 0.45, "total_loss": round(sum(parts.values()), 5)})
lines.append({"bbox/AP": 41.2 if healthy else 3.1, "bbox/AP50": 70.3 if healthy else 8.4, "iteration": max_iter - 1})
with open("metrics.json", "w") as f:
    f.write("".join(json.dumps(x) + "\n" for x in lines))
