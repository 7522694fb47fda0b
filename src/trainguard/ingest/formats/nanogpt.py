"""Karpathy's nanoGPT family: nanoGPT's train.py console, build-nanogpt's console and its log.txt records,
and nanochat's base_train console."""

from trainguard.ingest.formats import FormatContract
from trainguard.ingest.formats._text import TextRules, declare_text

declare_text(
    FormatContract(
        name="nanogpt console",
        family="nanoGPT",
        writer="karpathy/nanoGPT train.py: print(f\"iter {iter_num}: loss {lossf:.4f}, time {dt*1000:.2f}ms, mfu "
               "{running_mfu*100:.2f}%\") and print(f\"step {iter_num}: train loss ..., val loss ...\")",
        files=("*.log", "*.out", "*.txt"),
        metrics="`iter N: loss X` per log interval; `step N: train loss X, val loss Y` per evaluation",
        step_axis="iterations (= optimizer steps; micro-steps are gradient accumulation inside one)",
        plan="max_iters in the config printed first (configurator's 'Overriding: max_iters = 3000')",
        completion="none printed: the loop breaks after iter max_iters; reaching it is the end",
        parts="none",
    ),
    TextRules(
        format="nanogpt console",
        plan_steps=("max_iters",),
        sample=("iter {step}: loss {loss}, time 85.20ms, mfu 30.12%",
                "step {step}: train loss {loss}, val loss {val}"),
    ),
)

declare_text(
    FormatContract(
        name="build-nanogpt",
        family="nanoGPT",
        writer="karpathy/build-nanogpt train_gpt2.py: console 'step {step:5d} | loss: ... | lr ... | norm: ... | dt: "
               "...ms | tok/sec: ...', 'validation loss: X', 'HellaSwag accuracy: a/b=X'; log.txt lines "
               "'{step} train X', '{step} val X', '{step} hella X'",
        files=("log.txt", "*.log"),
        metrics="log.txt: `train` is the step's loss, `val` the validation loss, `hella` HellaSwag accuracy",
        step_axis="optimizer steps, 0-based",
        plan="max_steps in the script (not printed)",
        completion="the last step (max_steps - 1) is evaluated off the every-250-steps cadence (`last_step`), "
                   "then trained: an off-cadence final evaluation followed by its step is the end",
        parts="none",
    ),
    TextRules(
        format="build-nanogpt",
        record_lines={"train": "loss", "val": "eval:loss", "hella": "eval:hella"},
        sample=("{step} val {val}", "{step} train {loss}"),
    ),
)

declare_text(
    FormatContract(
        name="nanochat console",
        family="nanoGPT",
        writer="karpathy/nanochat scripts/base_train.py: print0(f\"step {step:05d}/{num_iterations:05d} "
               "({pct_done:.2f}%) | loss: ... | lrm: ... | dt: ... | tok/sec: ... | mfu: ... | total time: ...\")",
        files=("*.log",),
        metrics="`loss` (a debiased EMA); `lrm` is the LR multiplier, not the LR; 'Validation bpb: X'",
        step_axis="optimizer steps, 0-based",
        plan="the `/N` after the step (num_iterations)",
        completion="the step line at N; 'Total training time' at the end",
        parts="none",
    ),
    TextRules(
        format="nanochat console",
        completion=(r"\btotal training time:",),
        sample=("step {step:05d}/{total:05d} (1.00%) | loss: {loss} | lrm: 1.00 | dt: 500.00ms | tok/sec: 1,000,000",),
    ),
)
