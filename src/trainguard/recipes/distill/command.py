"""`trainguard distill CONFIG.yaml`: the command line of the recipe.

The config is read and checked before torch or transformers load, so a typo costs a second. Bad input
(missing file, malformed YAML, unknown key, wrong type, impossible combination) prints one line on
stderr and exits 2, never a traceback.
"""

from __future__ import annotations

import json
import sys

import click

from trainguard.errors import UserError


@click.command("distill")
@click.argument("config")
@click.option("--run-dir", default=None, help="Run folder (default: a new one under ./trainguard-runs/).")
@click.option("--max-steps", type=int, default=None, help="Override train.max_steps (optimizer steps).")
@click.option("--resume", default=None, help="Checkpoint (last.pt or best.pt) to continue from.")
@click.option("--device", default=None, help="Override device: cpu, cuda or auto.")
@click.option("--json", "as_json", is_flag=True, help="Print the result (evaluations, losses) as JSON at the end.")
def distill_command(config: str, run_dir: str | None, max_steps: int | None, resume: str | None,
                    device: str | None, as_json: bool) -> None:
    """Distils a teacher causal LM into a student, as CONFIG (a YAML file, or `bundled`) describes."""
    from trainguard.recipes.distill import BUNDLED_CONFIG
    from trainguard.recipes.distill.config import load_config

    overrides: dict = {}
    if max_steps is not None:
        overrides["train.max_steps"] = max_steps
    if device is not None:
        overrides["device"] = device
    try:
        cfg = load_config(BUNDLED_CONFIG if config == "bundled" else config, overrides)
        _require_extra()
        from trainguard.recipes.distill.train import train
        result = train(cfg, run_dir=run_dir, resume=resume)
    except UserError as exc:
        click.echo(f"trainguard distill: error: {exc}", err=True)
        sys.exit(exc.exit_code)
    if as_json:
        click.echo(json.dumps(result))


# What the recipe imports, some only deep inside a run (the tokenizer is built after the models load):
# all are checked before anything starts, so a missing one is one line, not a traceback mid-run.
EXTRA_LIBRARIES = ("torch", "transformers", "tokenizers")


def _require_extra() -> None:
    from importlib import import_module

    for name in EXTRA_LIBRARIES:
        try:
            import_module(name)  # imported by the run right after anyway, so this costs nothing extra
        except ImportError as exc:
            raise UserError(f"distill needs {name}: pip install 'trainguard[distill]' ({exc})") from None


def main() -> None:
    distill_command(prog_name="python -m trainguard.recipes.distill")
