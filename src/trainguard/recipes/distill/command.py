"""`trainguard distill CONFIG.yaml` and `trainguard distill cache build|verify|info`: the recipe's CLI.

The config is read and checked before torch or transformers load, so a typo costs a second. Bad input
(missing file, malformed YAML, unknown key, wrong type, impossible combination) prints one line on
stderr and exits 2, never a traceback.
"""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING

import click

from trainguard.errors import UserError

if TYPE_CHECKING:
    from trainguard.recipes.distill.config import DistillConfig


@click.command("run")
@click.argument("config")
@click.option("--run-dir", default=None, help="Run folder (default: a new one under ./trainguard-runs/).")
@click.option("--max-steps", type=int, default=None, help="Override train.max_steps (optimizer steps).")
@click.option("--resume", default=None, help="Checkpoint (last.pt or best.pt) to continue from.")
@click.option("--device", default=None, help="Override device: cpu, cuda or auto.")
@click.option("--json", "as_json", is_flag=True, help="Print the result (evaluations, losses) as JSON at the end.")
def run_command(config: str, run_dir: str | None, max_steps: int | None, resume: str | None,
                    device: str | None, as_json: bool) -> None:
    """Distils a teacher causal LM into a student, as CONFIG (a YAML file, or `bundled`) describes."""
    from trainguard.recipes.distill import BUNDLED_CONFIG
    from trainguard.recipes.distill.config import load_config

    _check_run_dir(run_dir, "trainguard distill")
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



def _check_run_dir(run_dir: str | None, prog: str) -> None:
    """--run-dir must be a folder or creatable as one: a file there (or above it) is one line, exit 2, before
    anything loads (the guard would decline it and the recipe's own writes then fail with a traceback)."""
    if run_dir is None:
        return
    from pathlib import Path

    p = Path(run_dir).expanduser().absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    if not p.is_dir():
        click.echo(f"{prog}: error: --run-dir {run_dir}: {p} is not a folder; give a folder path", err=True)
        sys.exit(2)


class _ConfigFirstGroup(click.Group):
    """`trainguard distill CONFIG ...` runs a config; `trainguard distill cache ...` is the cache's group."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h"):
            args = ["run", *args]
        return super().parse_args(ctx, args)


@click.group("distill", cls=_ConfigFirstGroup)
def distill_command() -> None:
    """Distils a teacher causal LM into a student: `distill CONFIG` (a YAML file, or `bundled`), or the
    offline teacher cache: `distill cache build|verify|info`."""


distill_command.add_command(run_command)


def _load(config: str, device: str | None) -> DistillConfig:
    from trainguard.recipes.distill import BUNDLED_CONFIG
    from trainguard.recipes.distill.config import load_config

    return load_config(BUNDLED_CONFIG if config == "bundled" else config, {"device": device} if device else {})


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


def _refuse(message: str) -> None:
    """Bad input caught before anything heavy is imported: one line, exit 2."""
    click.echo(f"trainguard distill cache: error: {message}", err=True)
    sys.exit(2)


def _cache_call(fn: object) -> None:
    try:
        _require_extra()
        result = fn()  # type: ignore[operator]
    except UserError as exc:
        click.echo(f"trainguard distill cache: error: {exc}", err=True)
        sys.exit(exc.exit_code)
    click.echo(json.dumps(result))
    if isinstance(result, dict) and result.get("ok") is False:
        sys.exit(1)


@distill_command.group("cache")
def cache_group() -> None:
    """The offline teacher cache: the teacher's top-k over the corpus, written once, read by students."""


@cache_group.command("build")
@click.argument("config")
@click.option("--out", required=True, help="Cache folder (created; an unfinished one is resumed).")
@click.option("--k", type=int, default=None, help="Top-k kept per position (default: the config's loss.kd.top_k).")
@click.option("--shard-windows", type=int, default=256, show_default=True, help="Windows per shard file.")
@click.option("--max-windows", type=int, default=None, help="Only the first N training windows.")
@click.option("--run-dir", default=None, help="The guard's run folder for the build.")
@click.option("--device", default=None, help="Override device: cpu, cuda or auto.")
def cache_build_command(config: str, out: str, k: int | None, shard_windows: int, max_windows: int | None,
                        run_dir: str | None, device: str | None) -> None:
    """Runs the teacher of CONFIG once over its training text and writes the top-k cache to --out.

    With loss.kd.partial on (the default) it also writes, for CONFIG's student tokenizer, the teacher's
    targets at the student positions inside a teacher token, which such a student needs from a cache."""
    _check_run_dir(run_dir, "trainguard distill cache")
    for name, value in (("--shard-windows", shard_windows), ("--k", k), ("--max-windows", max_windows)):
        if value is not None and value < 1:
            _refuse(f"{name} must be >= 1, got {value}"
                    + (" (leave --max-windows out for every window)" if name == "--max-windows" else ""))

    def go() -> object:
        from trainguard.recipes.distill.cache_build import build_cache

        return build_cache(_load(config, device), out, k=k, shard_windows=shard_windows, max_windows=max_windows,
                           run_dir=run_dir)
    _cache_call(go)


@cache_group.command("verify")
@click.argument("folder")
@click.argument("config")
@click.option("--shards", type=int, default=2, show_default=True, help="Random shards recomputed with the teacher.")
@click.option("--device", default=None, help="Override device: cpu, cuda or auto.")
def cache_verify_command(folder: str, config: str, shards: int, device: str | None) -> None:
    """Recomputes shards of the cache in FOLDER with CONFIG's teacher; exit 1 when they differ."""
    if shards < 1:  # checking nothing must not say ok
        _refuse(f"--shards must be >= 1, got {shards}: it is how many shards are recomputed with the teacher")

    def go() -> object:
        from trainguard.recipes.distill.cache_build import verify_cache

        return verify_cache(_load(config, device), folder, shards=shards)
    _cache_call(go)


@cache_group.command("info")
@click.argument("folder")
def cache_info_command(folder: str) -> None:
    """What the cache in FOLDER holds: settings, shards done, bytes per position."""
    def go() -> object:
        from trainguard.recipes.distill.cache_build import cache_info

        return cache_info(folder)
    _cache_call(go)


def main() -> None:
    distill_command(prog_name="python -m trainguard.recipes.distill")
