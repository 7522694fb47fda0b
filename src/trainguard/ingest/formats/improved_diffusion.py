"""OpenAI's improved-diffusion / guided-diffusion logger (and its copies, e.g. DiffuSeq): `dumpkvs` prints
each log interval as a key/value table between dashed lines."""

from trainguard.ingest.formats import FormatContract
from trainguard.ingest.formats._text import TextRules, declare_text

declare_text(
    FormatContract(
        name="openai logger table",
        family="OpenAI improved-diffusion",
        writer="openai/improved-diffusion improved_diffusion/logger.py (HumanOutputFormat.writekvs: a dashed line, "
               "'| key | value |' rows sorted by key, a dashed line); train_util.py logs step, samples, loss, "
               "grad_norm, loss_q0..q3 (the loss per quartile of diffusion timesteps)",
        files=("*.out", "log.txt", "*.log"),
        metrics="one record per table: `loss`, `grad_norm`, `mse`, `vb`; `loss_q0..3` are the same loss by "
                "timestep quartile, not parts",
        step_axis="the `step` row (optimizer steps); `samples` is a sample counter",
        plan="--lr_anneal_steps (improved-diffusion), --learning_steps (DiffuSeq) on the printed command line",
        completion="the step at the planned total; the loop otherwise runs until killed",
        parts="independent",
    ),
    TextRules(
        format="openai logger table",
        plan_steps=("lr_anneal_steps", "learning_steps"),
        sample=("-------------------------", "| grad_norm | 0.889    |", "| loss      | {loss}    |",
                "| loss_q0   | 0.531    |", "| samples   | 2.63e+06 |", "| step      | {step}      |",
                "-------------------------"),
    ),
)
