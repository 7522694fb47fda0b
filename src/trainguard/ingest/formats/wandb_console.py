"""Weights & Biases' console lines, as they land in a run's output (and in wandb's own output.log)."""

from trainguard.ingest.formats import FormatContract
from trainguard.ingest.formats._text import TextRules, declare_text

declare_text(
    FormatContract(
        name="wandb console",
        family="Weights & Biases",
        writer="wandb/wandb wandb/sdk/wandb_run.py (_footer: 'Run history:' sparklines, 'Run summary:' rows "
               "'wandb: <key> <value>', 'Synced N W&B file(s)'), printed by wandb.finish() or at interpreter exit",
        files=("output.log", "*.err", "*.out"),
        metrics="the summary's last values (not a step's)",
        step_axis="none",
        plan="none",
        completion="'Run summary:' then the sync footer: the process reached wandb.finish() or a normal exit (an "
                   "exception's traceback before it decides otherwise)",
        parts="none",
        notes=("a SIGKILL, the OOM killer or a scheduler's cancel leave no footer",),
    ),
    TextRules(
        format="wandb console",
        completion=(r"^wandb: synced \d+ w&b file",),
        sample=("wandb: Run summary:", "wandb:       train_loss {loss}", "wandb: Synced 6 W&B file(s), 0 media file(s)"),
    ),
)
