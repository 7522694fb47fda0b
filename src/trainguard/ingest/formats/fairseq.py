"""fairseq's console (progress_bar 'simple'/'json' via logging): train_inner lines, epoch summaries,
valid lines and the closing 'done training' line."""

from trainguard.ingest.formats import FormatContract
from trainguard.ingest.formats._text import TextRules, declare_text

declare_text(
    FormatContract(
        name="fairseq console",
        family="fairseq",
        writer="facebookresearch/fairseq fairseq_cli/train.py (train_inner / train / valid stats via "
               "fairseq/logging/progress_bar.py SimpleProgressBar: 'epoch 001:    100 / 1000 loss=...'; "
               "'done training in {:.1f} seconds')",
        files=("*.log", "train.log"),
        metrics="loss, nll_loss, ppl, lr, gnorm, num_updates; `valid on 'valid' subset` lines are evaluations",
        step_axis="num_updates (optimizer steps); the `100 / 1000` is the batch within the epoch",
        plan="--max-epoch / --max-update in the printed Namespace or config",
        completion="'done training in N seconds'",
        parts="none",
    ),
    TextRules(
        format="fairseq console",
        completion=(r"done training in",),
        plan_steps=("max_update",),
        plan_epochs=("max_epoch",),
        sample=("epoch {epoch:03d}:    100 / 1000 loss={loss}, nll_loss=2.1, ppl=4.3, wps=1000, ups=2, lr=0.0005, "
                "gnorm=1.2, num_updates={step}",),
    ),
)
