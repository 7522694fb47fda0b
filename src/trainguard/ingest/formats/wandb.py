"""Weights & Biases' local run folder: `wandb/run-<date>-<id>/` (`latest-run` links the newest).

Read from: wandb/wandb `wandb/sdk/internal/sender.py` and `wandb/sdk/lib/filenames.py` (`files/output.log`:
the process's console output as the run saw it; `files/wandb-summary.json`: the summary, each key's last
value plus `_step`, `_runtime`, `_timestamp`, `_wandb.runtime`; `files/config.yaml`: `key: {desc, value}`
for each config key; `files/wandb-metadata.json`: program, args, start time; `run-<id>.wandb`: the binary
record stream, not read here).
"""

from trainguard.ingest.formats import FormatContract, declare

declare(
    FormatContract(
        name="wandb run folder", family="Weights & Biases",
        writer="wandb/wandb wandb/sdk/lib/filenames.py; wandb/sdk/internal/sender.py (summary, config, console)",
        files=("files/output.log", "files/wandb-summary.json", "files/config.yaml", "files/wandb-metadata.json"),
        metrics="output.log read as a text log; wandb-summary.json's last values when the console holds none",
        step_axis="output.log: the text log's steps; the summary: `_step`, the count of wandb.log calls",
        plan="config.yaml: epochs / num_epochs / max_epochs, or max_steps / max_iters (nanoGPT) / total_steps (each "
             "under `value:`)",
        completion="the summary's `epoch` at the planned epochs, or the last step (the console's, else the summary's "
                   "`iter` / `step` / `global_step`) at the planned steps; a traceback in output.log is a crash",
        parts="independent",
        notes=("the summary is rewritten during the run: it shows where the run was, not that it finished",
               "a run whose summary holds no metric never logged one"),
        plan_files=("files/config.yaml",),
        plan_keys=("epochs", "num_epochs", "max_epochs", "n_epochs", "max_steps", "max_iters", "total_steps",
                   "num_iterations", "train_steps"),
    ),
)
