"""AI2's OLMo trainer console (allenai/OLMo `olmo/train.py`, run by `scripts/train.py`): each logged step is a
record over several lines, the position first, then one indented `name=value` line per metric."""

from trainguard.ingest.formats import FormatContract
from trainguard.ingest.formats._text import TextRules, declare_text

declare_text(
    FormatContract(
        name="olmo console",
        family="OLMo",
        writer="allenai/OLMo olmo/train.py Trainer.log_metrics_to_console (log.info(f'{prefix}\\n' + '\\n'.join("
               "f'    {name}={format_float(value)}'))) with prefix f'[step={global_step}/{max_steps},epoch={epoch}]'"
               "; format_float writes values over 1000 as f'{int(value):,d}', under 1e-4 as str(value); "
               "scripts/train.py logs 'Training complete' when fit() returns",
        files=("train.log", "*.log", "files/output.log"),
        metrics="`train/CrossEntropyLoss` the loss, `optim/total_grad_norm` the gradient norm, "
                "`optim/learning_rate_group0` the LR (when logged), `eval/<set>/CrossEntropyLoss` evaluations; "
                "throughput and memory lines are read and left aside",
        step_axis="optimizer steps (global_step), 1-based",
        plan="the `/max_steps` of every record's first line (max_duration in steps); the run may go a few "
             "steps past it to reach its next eval or save interval",
        completion="'Training complete'",
        parts="none",
        notes=("every record spans several lines: a reader of single lines sees only positions and orphan "
               "name=value lines, never a step's loss",),
    ),
    TextRules(
        format="olmo console",
        block_head=r"\[step=(?P<step>\d{1,12})/(?P<total>\d{1,12}),epoch=(?P<epoch>\d{1,9})\]\s*$",
        keys={"train/crossentropyloss": "loss", "optim/total_grad_norm": "grad_norm",
              "optim/learning_rate_group0": "lr"},
        sample=("2025-12-11 00:30:18.925\thost:0\tolmo.train:979\tINFO\t[step={step}/{total},epoch=0]",
                "    optim/total_grad_norm=1.234",
                "    train/CrossEntropyLoss={loss}",
                "    train/Perplexity=10,919",
                "    throughput/total_tokens=83,886,080",
                "    System/Peak GPU Memory (MB)=111,534"),
    ),
)
