"""DeepSpeed's own console: the engine's `steps_per_print` line, and the launcher's lines."""

from trainguard.ingest.formats import FormatContract
from trainguard.ingest.formats._text import TextRules, declare_text

declare_text(
    FormatContract(
        name="deepspeed console",
        family="DeepSpeed",
        writer="microsoft/DeepSpeed deepspeed/runtime/engine.py (_report_progress: '[Rank 0] step={}, skipped={}, "
               "lr={}, mom={}'), launcher/launch.py ('... exits successfully.')",
        files=("*.log", "*.out"),
        metrics="lr as a list per parameter group; the loss is the script's own print",
        step_axis="global_steps (optimizer steps); skipped counts fp16 overflow steps",
        plan="none (the script's own)",
        completion="the launcher's 'exits successfully' for every rank",
        parts="none",
    ),
    TextRules(
        format="deepspeed console",
        sample=("[Rank 0] step={step}, skipped=0, lr=[0.0001], mom=[(0.9, 0.999)]",),
    ),
)
