"""timm's train.py console: one line per log interval with the running average, and the test loop's."""

from trainguard.ingest.formats import FormatContract
from trainguard.ingest.formats._text import TextRules, declare_text

declare_text(
    FormatContract(
        name="timm console",
        family="timm",
        writer="huggingface/pytorch-image-models train.py (train_one_epoch: 'Train: {} [{:>4d}/{} ({:>3.0f}%)]  "
               "Loss: {loss.val:#.3g} ({loss.avg:#.3g})  Time: ...  LR: {lr:.3e}  Data: ...'; validate: "
               "'Test: [{:>4d}/{}]  ... Loss: ...  Acc@1: ...'), 'Scheduled epochs: N', '*** Best metric: ...'",
        files=("*.log", "*.out"),
        metrics="`Loss: X (avg)`: X this batch, the bracket the epoch's running mean; `LR`",
        step_axis="the bracket counts batches (batch_idx/last_idx) within the epoch: absolute with the epochs before",
        plan="'Scheduled epochs: N'",
        completion="the last scheduled epoch reached; '*** Best metric: X (epoch E)' closes main() but is printed "
                   "after a KeyboardInterrupt too (`except KeyboardInterrupt: pass`): it completes a run only where "
                   "no plan says it stopped short",
        parts="none",
        notes=("'Test: [i/n]' lines are the evaluation's progress; its last line holds the evaluation's result",
               "'Scheduled epochs: N' is printed once at start-up: another one begins a launch appended to the log"),
    ),
    TextRules(
        format="timm console",
        closing=(r"\*\*\* best metric:",),
        launch=(r"\bscheduled epochs:\s*\d",),
        plan_epochs=("scheduled epochs",),
        sample=("Train: {epoch} [{batch:>4d}/{batches} ({pct:>3.0f}%)]  Loss: {loss} (2.50)  Time: 0.250s,  "
                "1024.00/s  (0.260s,  990.00/s)  LR: 1.000e-03  Data: 0.010 (0.012)",),
    ),
)
