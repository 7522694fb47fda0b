"""Every log format trainguard reads, declared once as data: its writer's contract.

A format family is one module in this package that declares a `FormatContract` (or several) and appends it
to `FORMATS` through `declare`. The contract is written from the code that *writes* the format (the
framework's logger, printer or callback, named in `writer`), not from a sample file: what its fields
are, which axis its steps are counted on, where its plan is written, what marks a finished run, and what
its loss parts mean. Readers are generic over these contracts; tests generate a format's real-world
variants (prefixes, colour codes, tqdm redraws, resumed runs, truncated last lines, CRLF) from them; the
format table in `docs/formats.md` is rendered from `FORMATS` (a test fails when it drifts).

A new format is one new module here, its line in `families.py`, and its reader's entry in
`trainguard.ingest.detect`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

# How a format's loss parts relate to its total: "sum" (the total is their sum, perhaps weighted by
# `weights`), "median" (each value is a windowed median or mean of its own, so parts never sum exactly),
# "independent" (reported side by side, no relation promised), "none" (the format has no parts).
PartsMeaning = Literal["sum", "weighted-sum", "median", "independent", "none"]
# What a row's step counts, as the readers convert it to the rules' optimizer steps.
StepUnit = Literal["optimizer-step", "iteration", "epoch"]


@dataclass(frozen=True, kw_only=True)
class FormatContract:
    """What one writer promises about the files it writes."""

    name: str
    """The format's name as `diagnose` prints it ("ultralytics results.csv")."""
    family: str
    """The framework or tool that writes it ("Ultralytics")."""
    writer: str
    """Where the writer's code is: repository and path (and function), read when the contract was written."""
    files: tuple[str, ...]
    """File or folder names (globs) that hold it, relative to what the user points `diagnose` at."""
    metrics: str
    """The fields read, and how: names of the loss, LR, gradient norm, evaluations and parts."""
    step_axis: str
    """What a row's step counts: optimizer steps, epochs, iterations, samples; and how it is converted."""
    plan: str
    """Where the planned length (and patience, time limit) is written, or "none"."""
    completion: str
    """What marks a run that finished (a last line, a key, a row at the planned end), or "none"."""
    parts: PartsMeaning = "none"
    """What the loss parts mean against the total."""
    notes: tuple[str, ...] = field(default=())
    """Other semantics a rule must respect (a config dump printed first, resumed runs appended, ...)."""
    # -- the same, as data the readers act on --------------------------------------------------------
    step_unit: StepUnit = "optimizer-step"
    """What one row's step counts."""
    plan_files: tuple[str, ...] = field(default=())
    """Files beside the metrics (relative to their folder, first found wins) that state the plan."""
    plan_keys: tuple[str, ...] = field(default=())
    """Keys of the planned length in those files (or in the metrics file itself), in `step_unit`s;
    dotted for nested ones (`train_cfg.max_epochs`); the first present wins."""
    patience_keys: tuple[str, ...] = field(default=())
    """Keys of an early-stopping patience (in epochs) in the plan files: a run may end before its plan."""
    parts_from: tuple[str, ...] = field(default=())
    """Metric-name prefixes or suffixes (`train/`, `_loss`) whose values are loss parts."""
    cross_entropy: tuple[tuple[str, int], ...] = field(default=())
    """Loss fields (`loss` for the total, else a part's name) that the writer computes as a mean
    cross-entropy, each with its class count (2 for a binary one, 0 when the task decides): a uniform
    guess scores ln(count), and nothing starts far above ln of a million."""
    lr_decays_only: bool = False
    """The writer's LR schedule never rises after its warm-up (no restarts, no cycles)."""
    eval_same_loss: bool = False
    """The evaluation loss is the training loss's own function on held-out data (the Hugging Face
    Trainer's `prediction_step` calls `compute_loss`): the two are on one scale."""


FORMATS: list[FormatContract] = []


def declare(*contracts: FormatContract) -> None:
    """Adds contracts to the registry; a name is declared once."""
    for c in contracts:
        if any(f.name == c.name for f in FORMATS):
            raise ValueError(f"format {c.name!r} declared twice")
        FORMATS.append(c)


def contract(name: str) -> FormatContract | None:
    """The declared contract of the format `diagnose` names `name`, if any."""
    _load_all()
    return next((c for c in FORMATS if c.name == name), None)


def all_formats() -> list[FormatContract]:
    _load_all()
    return list(FORMATS)


def _load_all() -> None:
    """Imports every family module once (each declares itself on import); `families` lists them by name,
    where a reader and the layer check see them."""
    from trainguard.ingest.formats import families  # noqa: F401


def render_markdown() -> str:
    """docs/formats.md: per format, what is read (metrics, step axis, plan, completion, parts), from FORMATS."""
    out = ["# Formats trainguard diagnose reads", "",
           "Rendered from `trainguard.ingest.formats` (each format's contract, written from the code that writes it);",
           "`tests/test_formats.py` fails when this file drifts from the registry. Text logs are described in",
           "`trainguard.ingest.textlog`.", ""]
    for c in sorted(all_formats(), key=lambda c: (c.family.lower(), c.name)):
        out += [f"## {c.name}", "", f"*{c.family}*. Writer: {c.writer}.", "",
                f"- **files**: {', '.join(f'`{f}`' for f in c.files)}",
                f"- **metrics**: {c.metrics}",
                f"- **step axis**: {c.step_axis}",
                f"- **plan**: {c.plan}",
                f"- **completion**: {c.completion}",
                f"- **loss parts**: {c.parts}"]
        out += [f"- **note**: {n}" for n in c.notes]
        out.append("")
    return "\n".join(out)


def render_table() -> str:
    """The README's format table: per format, what `diagnose` reads (metrics, step axis, plan, completion)."""
    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    out = ["| format | metrics read | step axis | plan | completion |", "|---|---|---|---|---|"]
    for c in sorted(all_formats(), key=lambda c: (c.family.lower(), c.name)):
        out.append(f"| **{cell(c.name)}** ({cell(c.family)}) | {cell(c.metrics)} | {cell(c.step_axis)} | "
                   f"{cell(c.plan)} | {cell(c.completion)} |")
    return "\n".join(out)
