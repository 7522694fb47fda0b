"""YOLOv7 (and YOLOR, and YOLOv5 before its results.csv): `results.txt`, one space-padded row per epoch, no header.

Read from: WongKinYiu/yolov7 `train.py` (`train()`: `opt.yaml` and `hyp.yaml` written first, beside the empty
`weights/`; per batch the progress description `s = ('%10s' * 2 + '%10.4g' * 6) % ('%g/%g' % (epoch, epochs - 1),
mem, *mloss, targets.shape[0], imgs.shape[-1])`, `mloss` the epoch's running mean of `(lbox, lobj, lcls, loss)`
from `ComputeLoss`, whose `loss` is the sum of the three; at the epoch's end `results_file.write(s + '%10.4g' * 7
% results)`, `results` = (P, R, mAP@.5, mAP@.5:.95, val box, val obj, val cls) from `test.test`, left at its
initial zeros on the epochs `--notest` skips; a resumed run rewrites the file from the checkpoint's
`training_results` and appends; no early stopping; 'N epochs completed in H hours.' printed at the end).
"""

from trainguard.ingest.formats import FormatContract, declare

# the row's fields in order, as `train.py` formats them ("epoch" is `epoch/epochs-1`, "gpu_mem" like `3.21G`)
COLUMNS = ("epoch", "gpu_mem", "train/box_loss", "train/obj_loss", "train/cls_loss", "loss", "labels", "img_size",
           "metrics/precision", "metrics/recall", "metrics/mAP_0.5", "metrics/mAP_0.5:0.95",
           "val/box_loss", "val/obj_loss", "val/cls_loss")
# the evaluation's fields: all zero on an epoch `--notest` did not evaluate (its initial `results`)
EVAL_COLUMNS = COLUMNS[8:]
NOT_METRICS = ("gpu_mem", "labels", "img_size")  # the memory reserved, the last batch's label count, its size

declare(
    FormatContract(
        name="yolov7 results.txt", family="YOLOv7 / YOLOR",
        writer="WongKinYiu/yolov7 train.py train() (results_file.write at each epoch's end; opt.yaml, hyp.yaml)",
        files=("results.txt", "opt.yaml", "hyp.yaml"),
        metrics="no header; per row: epoch/last, gpu_mem, box, obj, cls (the epoch's mean loss parts), their total, "
                "labels, img_size, then P, R, mAP@.5, mAP@.5:.95 and the validation box, obj, cls losses (all zero on "
                "an epoch --notest did not evaluate)",
        step_axis="epoch, 0-based; one row per epoch; the first field is `epoch/(epochs - 1)`",
        plan="the `/N` of the first field (epochs - 1, fine-tuning's added epochs included); opt.yaml beside it: "
             "epochs",
        completion="a row at the last planned epoch (N of `N/N`); no early stopping",
        parts="sum", notes=("the total column is ComputeLoss's lbox + lobj + lcls, averaged over the epoch's batches",
                            "a resumed run rewrites the file from its checkpoint and appends to it"),
        step_unit="epoch", plan_files=("opt.yaml",), plan_keys=("epochs",),
        parts_from=("train/",), lr_decays_only=True,
    ),
)

# -- its console: the same row as the progress bar's description, under a header printed each epoch ---------

from trainguard.ingest.formats._text import TextRules, declare_text  # noqa: E402

declare_text(
    FormatContract(
        name="yolov7 console", family="YOLOv7 / YOLOR",
        writer="WongKinYiu/yolov7 train.py train() (logger.info of ('%10s' * 8) % ('Epoch', 'gpu_mem', 'box', 'obj', "
               "'cls', 'total', 'labels', 'img_size') each epoch, then the tqdm bar whose description is the row); "
               "test.py test() (('%20s' + '%12s' * 6) % ('Class', 'Images', 'Labels', 'P', 'R', 'mAP@.5', "
               "'mAP@.5:.95') as its bar, then the `all` row); '%g epochs completed in %.3f hours.'",
        files=("*.log", "*.out", "nohup.out"),
        metrics="rows without names under the header: epoch/last, gpu_mem, box, obj, cls (the epoch's running mean "
                "loss parts), total (their sum), labels, img_size; the test's `all` row: P, R, mAP@.5, mAP@.5:.95",
        step_axis="the bar's i/n counts batches within the epoch: absolute with the epochs before (a batch, not an "
                  "optimizer step: the optimizer steps every 64 / batch_size batches)",
        plan="the `/N` of the row's first field: the last planned epoch (epochs - 1)",
        completion="'N epochs completed in H hours.' after the last epoch; or the last planned epoch's row",
        parts="sum",
        notes=("the row's losses are running means over the epoch so far (they restart each epoch)",),
    ),
    TextRules(
        format="yolov7 console",
        completion=(r"\d+ epochs completed in [\d.]+ hours",),
        columns=(
            (r"\bepoch\s+gpu_mem\s+box\s+obj\s+cls\s+total\s+labels\s+img_size\b",
             ("epoch/last", "", "part:box_loss", "part:obj_loss", "part:cls_loss", "loss", "", "")),
            (r"\bclass\s+images\s+labels\s+p\s+r\s+map@\.5\s+map@\.5:\.95",
             ("=all", "", "", "eval:precision", "eval:recall", "eval:map50", "eval:map50_95")),
        ),
        sample=("     Epoch   gpu_mem       box       obj       cls     total    labels  img_size",
                "{epoch}/{epochs}     7.31G   0.05614   0.02542   0.02831   {loss}        56       640: 100%|#####| "
                "119/119 [01:12<00:00,  1.64it/s]"),
    ),
)
