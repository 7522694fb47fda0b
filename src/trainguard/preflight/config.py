"""Reading a training config for `trainguard check`: JSON or YAML, Hugging Face names or common ones.

    cfg = load_config("configs/train.yaml", dataset_size=100_000)
    cfg.get("grad_accum")      # gradient_accumulation_steps, grad_accum, accumulation_steps, ...
    cfg.where["grad_accum"]    # "training.gradient_accumulation_steps": the dotted key it came from

A config may be nested (`training: {lr: ...}`); keys are found at any depth by their last name. Each
known key has a type; a value of the wrong type, a malformed file or an unknown scheduler is bad input:
one line naming the dotted key (and the valid choices), exit 2. The user's file is never written.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainguard.errors import UserError
from trainguard.untrusted import json_problem, load_json, load_yaml, regular_file

# canonical name -> (type, names it goes by; Hugging Face TrainingArguments first)
KEYS: dict[str, tuple[type, tuple[str, ...]]] = {
    "epochs": (float, ("num_train_epochs", "epochs", "num_epochs", "n_epochs", "max_epochs")),
    "batch_size": (int, ("per_device_train_batch_size", "batch_size", "train_batch_size", "micro_batch_size")),
    "grad_accum": (int, ("gradient_accumulation_steps", "grad_accum", "gradient_accumulation",
                         "accumulation_steps", "accum_steps", "grad_accum_steps", "accumulate_grad_batches",
                         "grad_accumulation_steps")),
    "world_size": (int, ("world_size", "num_gpus", "n_gpus", "num_devices")),
    "max_steps": (int, ("max_steps", "total_steps", "train_steps", "num_steps", "max_iters")),
    "sched_steps": (int, ("num_training_steps", "scheduler_steps", "scheduler_total_steps", "lr_decay_steps",
                          "decay_steps", "t_max", "T_max", "lr_decay_iters")),
    "warmup_steps": (int, ("warmup_steps", "num_warmup_steps", "warmup_iters", "lr_warmup_steps")),
    "warmup_ratio": (float, ("warmup_ratio", "warmup_fraction", "warmup_proportion")),
    "eval_steps": (float, ("eval_steps", "eval_every", "eval_interval", "evaluation_steps")),
    "eval_strategy": (str, ("eval_strategy", "evaluation_strategy")),
    "save_steps": (float, ("save_steps", "save_every", "save_interval", "checkpoint_every", "checkpoint_steps")),
    "save_strategy": (str, ("save_strategy",)),
    "scheduler": (str, ("lr_scheduler_type", "scheduler", "scheduler_type", "lr_scheduler", "lr_schedule")),
    "lr": (float, ("learning_rate", "lr", "max_lr", "peak_lr")),
    "temperature": (float, ("temperature", "kd_temperature", "distill_temperature", "distillation_temperature")),
    "patience": (int, ("early_stopping_patience", "patience", "early_stop_patience")),
    "curriculum_steps": (int, ("curriculum_steps", "curriculum_ramp_steps", "curriculum_warmup_steps")),
    "curriculum_ratio": (float, ("curriculum_ratio", "curriculum_ramp_ratio", "curriculum_end_ratio")),
    "kd_top_k": (int, ("kd_top_k", "top_k", "topk", "kd_topk")),
    "vocab_size": (int, ("vocab_size", "student_vocab_size")),
    "max_length": (int, ("max_length", "max_seq_length", "max_seq_len", "seq_len", "block_size",
                         "context_length")),
    "max_positions": (int, ("max_position_embeddings", "n_positions", "n_ctx")),
    # the epoch's length in micro-batches (loader batches), when the config says it instead of a dataset size
    "micro_per_epoch": (int, ("batches_per_epoch", "micro_batches_per_epoch", "steps_per_epoch", "iters_per_epoch",
                              "num_batches", "train_batches_per_epoch", "num_batches_per_epoch")),
    "dataset_size": (int, ("dataset_size", "num_train_samples", "train_samples", "n_train", "train_size")),
    "eval_dataset_size": (int, ("eval_dataset_size", "num_eval_samples", "eval_samples", "val_size")),
    "eval_batch_size": (int, ("per_device_eval_batch_size", "eval_batch_size")),
}

SCHEDULERS = (
    "linear", "cosine", "cosine_with_restarts", "polynomial", "constant", "constant_with_warmup", "inverse_sqrt",
    "reduce_lr_on_plateau", "cosine_with_min_lr", "cosine_warmup_with_min_lr", "warmup_stable_decay",
    "onecycle", "one_cycle", "step", "multistep", "exponential", "cosine_annealing", "none",
)
STRATEGIES = ("no", "steps", "epoch", "best")


@dataclass
class Config:
    path: Path
    data: dict[str, Any]
    """The file as read (never changed)."""
    values: dict[str, Any] = field(default_factory=dict)
    """Canonical name -> value, for the keys found and not null."""
    where: dict[str, str] = field(default_factory=dict)
    """Canonical name -> dotted key in the file."""
    fmt: str = "json"

    def get(self, name: str, default: Any = None) -> Any:
        return self.values.get(name, default)


def load_config(path: str | Path, *, dataset_size: int | None = None) -> Config:
    p = Path(path)
    if not p.exists():
        raise UserError(f"config not found: {p}")
    regular_file(p, "config file")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"{p} is not a text config (not UTF-8 at byte {exc.start})") from None
    except OSError as exc:
        raise UserError(f"cannot read {p}: {exc.strerror or exc}") from None
    fmt = "json" if p.suffix.lower() == ".json" else "yaml"
    data = parse(text, fmt, p)
    cfg = Config(path=p, data=data, fmt=fmt)
    _collect(cfg, data, "")
    if dataset_size is not None:
        if dataset_size <= 0:
            raise UserError(f"--dataset-size must be a positive number of samples, got {dataset_size}")
        cfg.values["dataset_size"] = dataset_size
        cfg.where["dataset_size"] = "--dataset-size"
    return cfg


def parse(text: str, fmt: str, path: Path) -> dict[str, Any]:
    if fmt == "json":
        try:
            data = load_json(text)
        except ValueError as exc:
            raise UserError(f"{path}: malformed JSON: {json_problem(exc)}") from None
    else:
        import yaml

        try:
            data = load_yaml(text)
        except ValueError as exc:  # refused: an alias bomb, a recursive alias, nesting too deep
            raise UserError(f"{path}: refused YAML: {exc}") from None
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            raise UserError(f"{path}: malformed YAML{at}: {problem}") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: a config must be a mapping of keys to values, got {type(data).__name__}")
    return data


_ALIASES = {alias.lower(): name for name, (_, aliases) in KEYS.items() for alias in aliases}


def _collect(cfg: Config, data: dict[str, Any], prefix: str) -> None:
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict):
            _collect(cfg, value, dotted + ".")
            continue
        name = _ALIASES.get(str(key).lower())
        if name is None or name in cfg.values or value is None:
            continue
        cfg.values[name] = _typed(name, value, dotted)
        cfg.where[name] = dotted


def _typed(name: str, value: Any, dotted: str) -> Any:
    kind = KEYS[name][0]
    if kind is str:
        if not isinstance(value, str):
            raise UserError(f"config key {dotted}: expected a string, got {value!r}")
        low = value.lower()
        if name == "scheduler" and low not in SCHEDULERS:
            raise UserError(f"config key {dotted}: unknown scheduler {value!r} (choices: {', '.join(SCHEDULERS)})")
        if name in ("eval_strategy", "save_strategy") and low not in STRATEGIES:
            raise UserError(f"config key {dotted}: unknown strategy {value!r} (choices: {', '.join(STRATEGIES)})")
        return low
    if isinstance(value, str):
        # YAML 1.1 (PyYAML) reads `3e-5` (no dot) as a string; the user meant the number
        try:
            value = float(value.strip().replace("_", "")) if kind is float else _int_text(value)
        except ValueError:
            what = "an integer" if kind is int else "a number"
            raise UserError(f"config key {dotted}: expected {what}, got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        what = "an integer" if kind is int else "a number"
        raise UserError(f"config key {dotted}: expected {what}, got {value!r}")
    if isinstance(value, int) and abs(value) > 10**18:  # past any float's integer range and any real setting
        raise UserError(f"config key {dotted}: {len(str(abs(value)))}-digit number, too large for a setting")
    if not math.isfinite(value):
        raise UserError(f"config key {dotted}: expected a finite number, got {value!r}")
    if kind is int:
        if float(value) != int(value):
            raise UserError(f"config key {dotted}: expected an integer, got {value!r}")
        return int(value)
    return float(value)


def _int_text(text: str) -> int | float:
    """A number written as text for an integer key: `"1000"`, `"1e3"` (checked for integrality later)."""
    text = text.strip().replace("_", "")
    try:
        return int(text)
    except ValueError:
        return float(text)


def set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    """Sets `a.b.c` in a nested mapping (used on a copy, for --fix)."""
    parts = dotted.split(".")
    node = data
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value


def dump(data: dict[str, Any], fmt: str) -> str:
    if fmt == "json":
        return json.dumps(data, indent=2) + "\n"
    import yaml

    return yaml.safe_dump(data, sort_keys=False)
