"""Megatron-LM's console: training_log's one line per log interval and evaluate_and_print_results' box."""

from trainguard.ingest.formats import FormatContract
from trainguard.ingest.formats._text import TextRules, declare_text

declare_text(
    FormatContract(
        name="megatron console",
        family="Megatron-LM",
        writer="NVIDIA/Megatron-LM megatron/training/training.py (training_log: ' iteration {:8d}/{:8d} | consumed "
               "samples: ... | learning rate: ... | global batch size: ... | lm loss: ... | loss scale: ... | grad "
               "norm: ... |'; evaluate_and_print_results: ' validation loss at iteration N | lm loss value: ... | "
               "lm loss PPL: ... |')",
        files=("*.log", "*.out"),
        metrics="`lm loss` (and other `* loss` keys: parts, e.g. MoE aux losses), `learning rate`, `grad norm`, "
                "`loss scale`; `consumed samples` is a sample counter, not a step",
        step_axis="iterations (optimizer steps), 1-based",
        plan="the `/N` after the iteration (train_iters)",
        completion="the iteration line at N/N, then the final evaluation",
        parts="independent",
        notes=("'number of skipped iterations' and 'number of nan iterations' are counts, not metrics",),
    ),
    TextRules(
        format="megatron console",
        plan_steps=("train_iters",),
        sample=(" iteration {step:8d}/{total:8d} | consumed samples: 1024 | elapsed time per iteration (ms): 250.1 | "
                "learning rate: 1.500000E-04 | global batch size:     8 | lm loss: {loss} | loss scale: 1.0 | "
                "grad norm: 1.234 | number of skipped iterations:   0 | number of nan iterations:   0 |",),
    ),
)
