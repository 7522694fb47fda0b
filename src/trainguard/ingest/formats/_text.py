"""The machine-readable half of a printed (text) format's contract: what the generic text reader consults.

A family module declares its `FormatContract` (the prose a person reads) together with a `TextRules`
(the patterns and keys the reader uses) through `declare_text`. The reader (`trainguard.ingest.textlog`)
knows no framework by name: it compiles the union of every declared `TextRules` once (in `ingest.textlines`),
so a new printed format is a new family module, not a new branch in the reader. Tests generate each
format's real-world variants (logging prefixes, colour codes, tqdm redraws, appended relaunches, CRLF, cut
last lines) from `TextRules.sample`, the writer's own line shapes.

This module declares no format itself (its name starts with `_`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trainguard.ingest.formats import FormatContract, declare


@dataclass(frozen=True, kw_only=True)
class TextRules:
    """What one printed format's writer promises, in the terms the text reader uses."""

    format: str
    """The `FormatContract.name` these rules belong to."""
    completion: tuple[str, ...] = ()
    """Regexes (case-insensitive) of a line the writer prints only when training ended as planned or stopped
    itself on purpose (early stopping, a time budget)."""
    closing: tuple[str, ...] = ()
    """Regexes (case-insensitive) of a closing line the writer prints once its loop is over (a final snapshot,
    a `Best Epoch N ...` summary): the run completed when no training step follows it. Unlike `completion`,
    the same line printed mid-run (a periodic snapshot) is undone by the steps after it, and a plan the log
    states and did not reach outweighs it (a loop left early still prints its summary)."""
    launch: tuple[str, ...] = ()
    """Regexes (case-insensitive) of a line the writer prints once as it starts (a start-up banner): a later one
    begins another launch appended to the same log, and the log is judged on its last launch that trains."""
    plan_steps: tuple[str, ...] = ()
    """Names of the setting that holds the planned optimizer steps, as printed in a config dump, an args
    Namespace or a command line (`max_iters = 3000`, `MAX_ITER: 2000`, `--learning_steps 50000`)."""
    plan_epochs: tuple[str, ...] = ()
    """Names of the setting that holds the planned epochs (`epochs: 400`, `max_epochs=100`)."""
    batch_size: tuple[str, ...] = ()
    """Names of the setting that holds the batch size, where a sample counter needs it to count batches."""
    sample_counter: str | None = None
    """A regex whose groups (epoch, samples done, dataset size) mark a SAMPLE counter, not a step: the reader
    turns it into batches (the samples over the counter's smallest increment, one per printed interval)."""
    not_evaluation: tuple[str, ...] = ()
    """Regexes of lines that look like an evaluation's result and are not (a config dump's `EVAL_PERIOD: 200`,
    an evaluation's per-sample progress)."""
    weighted_parts: str | None = None
    """A regex of the writer's metric line whose loss parts are printed already multiplied by their weights
    (weights not printed): the rules then cannot tell a part small by design from one out of scale."""
    record_lines: dict[str, str] = field(default_factory=dict)
    """For `STEP NAME VALUE` record logs (build-nanogpt's log.txt): NAME -> what the value is ("loss" for the
    step's training loss; "eval:<metric>" for an evaluation's metric)."""
    keys: dict[str, str] = field(default_factory=dict)
    """Printed names (lower-cased, as `name: value` / `name = value` / `name:value`) that the writer uses for
    a position or a known metric under its own short name -> what it is: "step" (the optimizer step),
    "epoch", "batch" (a counter within the epoch: absolute with the epochs before it, a step without one),
    "loss", "lr", "grad_norm", or "eval:<metric>" (an evaluation's metric). llm.c's `s:N trl:X`, `ep: 0,
    batch: 20`."""
    keys_when: str | None = None
    """A regex a line must match for `keys` to apply (llm.c's `s` means the step only on its own lines);
    None: on every line."""
    parts_after: str | None = None
    """A regex of the writer's loss line whose every named value after the match is one loss of the model,
    the writer printing no total (the pix2pix/CycleGAN template's `(epoch: 3, iters: 400, time: ...) G_GAN:
    0.71 G_L1: 12.3 ...`): the values are read as loss parts and the step's loss is their sum."""
    columns: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """Tables the writer prints without names on their rows (YOLOv7's `      12/299     3.21G    0.0561 ...`): each
    a regex of the header line that opens it, and each column's meaning in order. After the header (until
    another table's), a line whose first fields fill the columns is a row. Meanings: "epoch/last" (the 0-based
    epoch over the last planned one), "loss" (the total), "part:<name>" (a loss part of it), "eval:<metric>"
    (an evaluation's metric: the row is an evaluation at the current step), "=<text>" (the field must read so:
    the row of all classes), "" (no metric: memory, a count, a size). A tqdm bar drawn after a training row
    (`: 100%|###| 119/119 [...]`) places it within its epoch: the step is the batch, absolute with the epochs
    before."""
    block_head: str | None = None
    """A regex of a line that opens a multi-line record (OLMo's `[step=10/2500,epoch=0]`): named groups `step`
    and optionally `total` (the planned steps) and `epoch`. The record's metrics follow, one per indented
    `name=value` line (`    train/CrossEntropyLoss=9.298`, thousands written `10,919`), until the first
    line that is not one; `keys` name what they are."""
    abbreviated: str | None = None
    """A regex of the writer's step line whose named group `count` is the step printed by a big-number
    formatter (LeRobot's `format_big_number`: `800`, then `1K`, `2K`, ..., `1M`): the reader takes a rounded
    count as the last step plus the log's cadence when that agrees with the rounding, else its nominal value."""
    sample: tuple[str, ...] = ()
    """A few lines shaped exactly as the writer prints them (placeholders `{step}`, `{epoch}`, `{total}`,
    `{loss}`), from which tests build a log: the writer's format strings, not lines copied from a log."""


TEXT: list[TextRules] = []


def declare_text(contract: FormatContract, rules: TextRules) -> None:
    """Declares a printed format: its contract in the registry, its rules for the text reader."""
    if rules.format != contract.name:
        raise ValueError(f"text rules for {rules.format!r} declared with the contract of {contract.name!r}")
    declare(contract)
    TEXT.append(rules)


def text_rules() -> list[TextRules]:
    """Every printed format's rules (importing every family module once: `families.py` names them)."""
    from trainguard.ingest.formats import _load_all

    _load_all()
    return list(TEXT)
