"""Sinks: a run's numbers and findings copied to where people already look.

    trainguard run --sink tensorboard --sink wandb --sink mlflow --sink prometheus -- python train.py
    TRAINGUARD_SINKS="tensorboard,prometheus=/var/lib/node_exporter/train.prom" trainguard run -- ...
    trainguard export RUN --sink mlflow=file:./mlruns          # a finished run, once

Each sink is fed from the run folder (run.db and status.json), never from the training process, so a
slow or broken sink cannot touch training: the feed runs in a thread of `trainguard run`, a sink that
raises is logged once to guard.log and dropped, and the run's verdict and exit code never depend on it.

| sink | default target (`NAME=VALUE` overrides) | what it gets |
|---|---|---|
| `tensorboard` | `RUN/tensorboard` (a log dir) | every step's scalars, evaluations, each finding as text at its step |
| `wandb` | the W&B project `trainguard` (`WANDB_MODE`, `WANDB_PROJECT` apply) | scalars, each finding as an alert and in the summary, the final state |
| `mlflow` | MLflow's tracking URI (`MLFLOW_TRACKING_URI`, else `./mlruns`) | scalars, findings as tags and `trainguard/findings.json`, the final state |
| `prometheus` | `RUN/metrics.prom` (a textfile); `:PORT` serves an endpoint | state, step, loss, LR, one series per finding |

Each sink imports its library only when it is opened (`pip install trainguard[wandb]`, `[mlflow]`,
`[prometheus]`; TensorBoard comes with `[integrations]`), and a missing library is a one-line error
before the run starts.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from trainguard.contract import ENV_SINKS
from trainguard.errors import UserError

# name -> (the library it needs, the extra that brings it); `open_sink` names each one's module
SINKS: dict[str, tuple[str, str]] = {
    "tensorboard": ("tensorboard", "integrations"),
    "wandb": ("wandb", "wandb"),
    "mlflow": ("mlflow", "mlflow"),
    "prometheus": ("prometheus_client", "prometheus"),
}


class Sink(Protocol):
    """The whole surface of a sink. Calls come from one thread, in order.

    `scalars` gets one optimizer step's numbers (or an evaluation's, keys prefixed `eval/`), `finding`
    each finding once (a dict as in status.json), `flush` comes after each pass over the store (a sink
    may hold scalars until then and send them in one batch), `close` the final status.json once at the
    end. A sink may raise: the feed logs the error once and stops calling that sink; it must never block
    for long.
    """

    def scalars(self, step: int, values: dict[str, float], t: float) -> None: ...

    def finding(self, finding: dict[str, Any]) -> None: ...

    def flush(self) -> None: ...

    def close(self, status: dict[str, Any]) -> None: ...


@dataclass(frozen=True)
class SinkSpec:
    name: str
    value: str | None = None  # the part after "=": a folder, a URI, a textfile or ":PORT"


def parse_specs(flags: tuple[str, ...] | list[str], env: str | None = None) -> list[SinkSpec]:
    """`--sink NAME[=VALUE]` flags (each may hold a comma-separated list) plus $TRAINGUARD_SINKS.

    Unknown names are a UserError naming the valid ones; a flag overrides the environment's same sink.
    """
    env = os.environ.get(ENV_SINKS, "") if env is None else env
    specs: dict[str, SinkSpec] = {}
    for source in (env, *flags):
        for item in (s.strip() for s in source.split(",")):
            if not item:
                continue
            name, _, value = item.partition("=")
            name = name.strip().lower()
            if name not in SINKS:
                raise UserError(f"unknown sink {name!r}: choose from {', '.join(SINKS)} "
                                f"(--sink NAME[=VALUE] or {ENV_SINKS})")
            specs[name] = SinkSpec(name, value.strip() or None)
    return list(specs.values())


def check_available(specs: list[SinkSpec]) -> None:
    """A sink whose library is not installed is bad input: say which extra brings it, before the run."""
    from importlib.util import find_spec

    for spec in specs:
        library, extra = SINKS[spec.name]
        try:
            found = find_spec(library) is not None
        except (ImportError, ValueError):  # a parent package that fails, a module marked unimportable
            found = False
        if not found:
            raise UserError(f"the {spec.name} sink needs {library}: pip install 'trainguard[{extra}]'")


def open_sink(spec: SinkSpec, run_dir: Path) -> Sink:
    # imported only when asked for: each module imports its library, which may be heavy or missing
    if spec.name == "tensorboard":
        from trainguard.sinks import tb

        return tb.open_sink(run_dir, spec.value)
    if spec.name == "wandb":
        from trainguard.sinks import wandb_sink

        return wandb_sink.open_sink(run_dir, spec.value)
    if spec.name == "mlflow":
        from trainguard.sinks import mlflow_sink

        return mlflow_sink.open_sink(run_dir, spec.value)
    from trainguard.sinks import prometheus_sink

    return prometheus_sink.open_sink(run_dir, spec.value)
