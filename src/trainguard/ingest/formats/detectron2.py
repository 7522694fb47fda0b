"""detectron2's `metrics.json`: JSON lines from `JSONWriter`.

Read from: facebookresearch/detectron2 `detectron2/utils/events.py` (`JSONWriter.write`: one object per
write with `iteration` and `EventStorage.latest_with_smoothing_hint(window_size=20)`: a scalar put with
`smoothing_hint=True`, every loss and `time`, is the *median of its last 20 values*; `lr`, `eta_seconds`
and evaluation results are put without smoothing) and `detectron2/engine/hooks.py` (`PeriodicWriter`
writes every 20 iterations and after the last one; `EvalHook` puts `bbox/AP`, `segm/AP50`... at the
iteration it evaluated; `CommonMetricPrinter` puts `eta_seconds` = mean iteration time x iterations left).
"""

from trainguard.ingest.formats import FormatContract, declare

declare(
    FormatContract(
        name="detectron2 metrics.json", family="detectron2",
        writer="facebookresearch/detectron2 detectron2/utils/events.py JSONWriter; detectron2/engine/hooks.py "
               "PeriodicWriter, EvalHook",
        files=("metrics.json",),
        metrics="total_loss and its parts loss_* (each a median over the last 20 iterations), lr, time, "
                "data_time, eta_seconds; evaluation rows bbox/*, segm/*, keypoints/*",
        step_axis="iteration, 0-based (the last of MAX_ITER is MAX_ITER - 1)",
        plan="none written; iteration + 1 + eta_seconds / time is the planned MAX_ITER",
        completion="eta_seconds near 0 at the last row (the writer's last write is after the last iteration)",
        parts="median",
        notes=("each part is its own windowed median: parts never sum to total_loss exactly, and their "
               "ratio is not the ratio of what the optimizer saw",
               "NaN in an evaluation bucket (APl with no large objects) is not a training fault"),
        step_unit="iteration",
        # fast_rcnn.py: softmax cross-entropy over K+1 classes, mean; rpn.py: objectness BCE (binary)
        cross_entropy=(("loss_cls", 0), ("loss_rpn_cls", 2)),
    ),
)
