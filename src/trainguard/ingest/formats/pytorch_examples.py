"""pytorch/examples' consoles: mnist and its copies ('Train Epoch: E [samples/size (p%)]\tLoss: X') and
word_language_model's '| epoch E | 200/2983 batches | lr ... | loss ... | ppl ...' tables."""

from trainguard.ingest.formats import FormatContract
from trainguard.ingest.formats._text import TextRules, declare_text

declare_text(
    FormatContract(
        name="pytorch/examples console",
        family="pytorch/examples",
        writer="pytorch/examples mnist/main.py: 'Train Epoch: {} [{}/{} ({:.0f}%)]\\tLoss: {:.6f}'.format(epoch, "
               "batch_idx * len(data), len(train_loader.dataset), ...); '\\nTest set: Average loss: {:.4f}, "
               "Accuracy: {}/{} ({:.0f}%)\\n'; word_language_model/main.py's '| epoch {:3d} | {:5d}/{:5d} batches "
               "| lr ... | loss ... | ppl ...' and 'End of training'",
        files=("*.log", "*.out", "*.txt"),
        metrics="`Loss:` the batch's loss; the test line's average loss and accuracy (a fraction a/b) are the "
                "evaluation",
        step_axis="the bracket is a SAMPLE counter (batch_idx * batch size), not a step: steps are the samples "
                  "over the counter's increment (one per log interval), made absolute with the epochs before",
        plan="--epochs on the command line (default 14 for mnist)",
        completion="'End of training' (word_language_model); mnist prints nothing: the last epoch's test line",
        parts="none",
    ),
    TextRules(
        format="pytorch/examples console",
        completion=(r"\bend of training\b",),
        plan_epochs=("epochs",),
        batch_size=("batch-size", "batch_size"),
        sample_counter=r"train epoch:\s*(\d+)\s*\[\s*(\d+)\s*/\s*(\d+)\s*\(\s*\d+%\s*\)\s*\]",
        sample=("Train Epoch: {epoch} [{samples}/{size} ({pct:.0f}%)]\tLoss: {loss}",
                "Test set: Average loss: {val}, Accuracy: 9800/10000 (98%)"),
    ),
)
