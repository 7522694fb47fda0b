"""Tables and JSON lines with no framework behind them that trainguard knows: read by their column names.

The contract is the names alone (`trainguard.ingest.events`: LOSS_NAMES, LR_NAMES, STEP_NAMES, the eval
prefixes): a `step`/`epoch`/`iteration` column, a loss, an LR, eval columns by prefix.
"""

from trainguard.ingest.formats import FormatContract, declare

declare(
    FormatContract(
        name="csv", family="any CSV with a step or epoch column",
        writer="(none: the names are the contract)",
        files=("*.csv", "*.tsv"),
        metrics="loss / train_loss / total_loss, lr / learning_rate, grad_norm; val_*, eval_*, test_* columns",
        step_axis="the step, iteration or epoch column, as written",
        plan="none", completion="none", parts="independent",
        notes=("`*_loss` / `loss_*` columns beside a total are parts; their relation to it is not known",),
    ),
    FormatContract(
        name="json lines", family="any JSON Lines with a step key",
        writer="(none: the names are the contract)",
        files=("*.jsonl", "*.ndjson", "*.json"),
        metrics="as for csv, one object per line",
        step_axis="the step / global_step / iteration key, as written",
        plan="total_steps when a record states it", completion="none", parts="independent",
    ),
)
