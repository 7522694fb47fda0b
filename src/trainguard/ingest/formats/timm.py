"""timm's `train.py`: `summary.csv`, one row per epoch.

Read from: huggingface/pytorch-image-models `timm/utils/summary.py` (`update_summary`: `epoch`,
`train_loss` (and the other train metrics prefixed `train_`), `eval_loss`, `eval_top1`, `eval_top5`, `lr`
when logged; the header is written with the first row) and `train.py` (epochs from `--epochs`, kept in
`args.yaml` in the same output folder).
"""

from trainguard.ingest.formats import FormatContract, declare

declare(
    FormatContract(
        name="timm summary.csv", family="timm (pytorch-image-models)",
        writer="huggingface/pytorch-image-models timm/utils/summary.py update_summary; train.py",
        files=("summary.csv", "args.yaml"),
        metrics="train_loss, eval_loss, eval_top1, eval_top5, lr",
        step_axis="epoch, 0-based; one row per epoch",
        plan="args.yaml beside it: epochs (plus cooldown_epochs)",
        completion="a row at the last planned epoch",
        parts="none",
        step_unit="epoch", plan_files=("args.yaml",), plan_keys=("epochs",),
        cross_entropy=(("loss", 0),),  # train.py: (soft-target) cross-entropy, mean over the batch
    ),
)
