"""llm.c's console (train_gpt2.cu / train_gpt2.py): one line per optimizer step with the plan after the
slash, and a z-score annotation after the loss and the norm."""

from trainguard.ingest.formats import FormatContract
from trainguard.ingest.formats._text import TextRules, declare_text

declare_text(
    FormatContract(
        name="llm.c console",
        family="llm.c",
        writer="karpathy/llm.c train_gpt2.cu (printf0 of 'step %4d/%d | loss %7.6f (%+.2fz)| norm %6.4f (%+.2fz)| "
               "lr %.2e | ...'), 'val loss %f'; its log file (-o: Logger's fprintf 's:%d trl:%.4f' per step and "
               "'s:%d tel:%.4f' per evaluation; derived trainers add ' lr:%f norm:%.2f')",
        files=("*.log", "*.out", "main.log"),
        metrics="`loss X (±Zz)`: X is the loss, the z-score a note; `norm` the gradient norm; `lr`; `val loss`; "
                "in the log file `trl` is the train loss, `tel` the validation loss, `s` the step",
        step_axis="optimizer steps, 1-based (step + 1 is printed)",
        plan="the `/N` after the step: train_num_batches",
        completion="the step line at N/N",
        parts="none",
        notes=("the log file's `lr:%f` prints 6 decimals: a decay's last steps print `lr:0.000000`; the step row "
               "carries `extra.lr_resolution` (1e-06) so a rule can tell a rounded LR from a zero one",),
    ),
    TextRules(
        format="llm.c console",
        keys={"s": "step", "trl": "loss", "tel": "eval:loss"},
        keys_when=r"(?:^|\s)s:\d+\s+(?:t[re]l|eval):",
        sample=("s:{step} trl:{loss} lr:0.000600 norm:0.25",
                "step {step:4d}/{total} | loss {loss} (-0.12z)| norm 1.2345 (+0.50z)| lr 6.00e-04 | 120.5 ms | "
                "41.2% bf16 MFU | 435000 tok/s"),
    ),
)
