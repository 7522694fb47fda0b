"""The recipe's configuration: one YAML file, checked completely before anything heavy loads.

Each section is a keyword-only dataclass with a docstring per field. `load_config` refuses unknown keys,
wrong types and impossible combinations with a one-line `UserError` naming the dotted key, so a typo
shows up in the first second, not at step 40,000. Nothing here imports torch or transformers.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainguard.errors import UserError

BUNDLED_DIR = Path(__file__).parent
KD_METHODS = ("kl", "uld", "gold", "t2s")  # xtok.METHODS (not imported: this module stays torch-free)


@dataclass(kw_only=True)
class ModelConfig:
    path: str | None = None
    """A local Hugging Face model folder (weights, config, tokenizer.json). Exclusive with `arch`."""
    arch: str | None = None
    """A `model_type` (qwen2, qwen2_moe, llama, ...) to build with random weights from `build`."""
    build: dict = field(default_factory=dict)
    """Keyword arguments of the model config for a random-init build (vocab_size comes from the tokenizer)."""
    tokenizer: str | None = None
    """A tokenizer.json (or a folder holding one). null: train a byte-level BPE on the training text."""
    vocab_size: int = 1024
    """Vocabulary size of a locally trained tokenizer (ignored when `tokenizer` or `path` is given)."""
    split_digits: bool = False
    """A trained tokenizer splits digits one by one (as Qwen and Llama do): then 2025 is four tokens."""
    bos: str | None = None
    """The token put before every window (so every text token is predicted). null: the tokenizer's own."""


@dataclass(kw_only=True)
class DataConfig:
    train: str = "bundled:data/tiny_train.txt"
    """Training text (UTF-8). Relative paths are relative to the YAML file; `bundled:` is the recipe's folder."""
    eval: str = "bundled:data/tiny_eval.txt"
    """Held-out text for evaluation, cut into fixed windows."""
    window_chars: int = 256
    """Characters of text per example (cut at a whitespace); both models tokenise exactly this text."""
    eval_windows: int = 32
    """Number of fixed held-out windows per evaluation (0 = all)."""
    teacher_cache: str | None = None
    """An offline teacher cache (`trainguard distill cache build`): KD targets come from it and the teacher
    is never loaded. Needs loss.hidden off; evaluation then reports the student's LM metrics only."""


@dataclass(kw_only=True)
class TermConfig:
    start: float = 0.0
    """Weight at the start of the ramp (and before it)."""
    end: float = 0.0
    """Weight at the end of the ramp (and after it). 0 with start 0 turns the term off."""
    ramp: list[float] = field(default_factory=lambda: [0.0, 0.2])
    """[from, to]: the linear ramp's window as fractions of the optimizer steps."""


@dataclass(kw_only=True)
class KDConfig(TermConfig):
    start: float = 0.1
    """KD weight at the start of the ramp (a small start: the student's early logits are noise)."""
    end: float = 0.7
    """KD weight after the ramp. Set start and end to 0 to train on LM loss alone."""
    top_k: int = 256
    """Teacher log-probs kept per position (mapped into student ids); the rest is one tail term."""
    temperature: float = 1.0
    """Softmax temperature on both sides; the loss is scaled by T^2 so its gradient keeps its size.
    Across tokenizers T = 2 hurt in benchmarks/distill_quality.py (0.681 vs 0.640 bits per byte at T = 1):
    flattening moves teacher mass into the tail, the one bin that cannot say which token."""
    positions: str = "context"
    """Which aligned positions are distilled: context (both sides have read the same bytes) or
    next_token (and their next tokens are the same string too)."""
    chunk: int = 512
    """Positions per chunk of the logit/KD computation: bounds the full-vocabulary logits held at once."""
    method: str = "kl"
    """kl: KL over the teacher's top-k mapped into student ids (exact-string overlap) plus one tail term;
    uld: sorted-probability L1 (Universal Logit Distillation, no id mapping); gold: KL on the mapped ids
    plus sorted L1 on both unmatched rests (TRL's GOLD hybrid); t2s: the teacher's hidden state projected
    into the student's and read out by the student's head (DSKD), a learned projection (optim.proj_lr)
    trained on the student's labels. See benchmarks/distill.md for what each gave."""
    vocab_map: str | None = None
    """How teacher ids become student ids. strict: one-to-one, identical strings whose longer extensions
    are identical too; merge: many-to-one by next-token event (each teacher id to the longest student token
    its text starts with, unless the student could read further than the teacher id allows). See vocab_map.py.
    null: merge for method kl (measured: benchmarks/distill.md), strict otherwise. With one tokenizer on
    both sides both are the identity."""
    target_prob: str = "mapped"
    """The teacher's probability of the student's actual next token. mapped: what one teacher position puts
    on the ids mapped to it; chain: where that token is spelled by whole teacher tokens, the product of
    the teacher's probabilities of those tokens (the chain rule), the other entries scaled to sum to 1."""
    partial: bool | None = None
    """Also distil student positions that end inside a teacher token, from the teacher's distribution at the
    last boundary conditioned on the bytes read since (partial.py). Method kl only. null: on for method kl.
    A data.teacher_cache then needs partial rows (format 2, built with partial on for this student's
    tokenizer); one without them is refused: rebuild it or set partial: false. With one tokenizer on both
    sides there are no such positions."""
    correct_only: bool = False
    """Distil only rows where the teacher's top-1, as a student id, is the student's next token."""
    renormalize: bool = False
    """kl only: renormalise the teacher's mapped top-k to 1 and drop the tail term."""


@dataclass(kw_only=True)
class HiddenConfig(TermConfig):
    depths: list[float] = field(default_factory=lambda: [0.5, 1.0])
    """Relative depths (0..1] of the layer pairs: student layer round(d*Ls) against teacher round(d*Lt)."""
    norm: str = "cosine"
    """cosine (1 - cos) or standardize (MSE of per-dimension standardised states)."""


@dataclass(kw_only=True)
class RoutingConfig(TermConfig):
    depth: float = 0.5
    """Relative depth (0..1] of the student hidden state the student-aware router reads, and of the
    teacher MoE layer whose routing it learns (its gates: `mlp.gate`)."""


@dataclass(kw_only=True)
class LossConfig:
    lm: float = 1.0
    """Weight of the student's own next-token cross-entropy. Always on: must be > 0."""
    kd: KDConfig = field(default_factory=KDConfig)
    hidden: HiddenConfig = field(default_factory=HiddenConfig)
    routing: RoutingConfig = field(default_factory=RoutingConfig)
    """KL(teacher routing || student-aware router) at aligned positions (MoE teachers; 0 = off)."""
    balance: TermConfig = field(default_factory=TermConfig)
    """Switch load-balance loss of the student-aware router (around 1e-3 to 1e-2; needs routing on)."""


@dataclass(kw_only=True)
class OptimConfig:
    lr: float = 1.0e-3
    """Peak learning rate of the student (AdamW)."""
    proj_lr: float = 3.0e-3
    """Peak learning rate of the student-to-teacher projections (fresh weights learn faster)."""
    min_lr_ratio: float = 0.1
    """The cosine decays to lr * min_lr_ratio at the last optimizer step."""
    warmup_steps: int = 10
    """Linear warmup, in optimizer steps."""
    weight_decay: float = 0.1
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    clip: float = 1.0
    """Gradient-norm clipping (0 = off)."""


@dataclass(kw_only=True)
class TrainConfig:
    batch_size: int = 8
    """Windows per micro-batch."""
    grad_accum: int = 1
    """Micro-batches per optimizer step."""
    max_steps: int = 100
    """Optimizer steps (the LR schedule and the curriculum are sized from this)."""
    log_every: int = 10
    """Print a line every N optimizer steps."""
    eval_every: int = 50
    """Evaluate every N optimizer steps (and at the end)."""
    save_every: int = 50
    """Write last.pt every N optimizer steps (and at the end; best.pt at each improvement)."""
    patience: int = 0
    """Early stopping: evaluations without a better eval bpb before stopping (0 = off)."""


@dataclass(kw_only=True)
class DistillConfig:
    seed: int = 0
    device: str = "auto"
    """cpu, cuda or auto (cuda when available)."""
    precision: str = "fp32"
    """fp32, bf16 (autocast) or fp16 (autocast + GradScaler, fp32 master weights; CUDA only)."""
    cpu_threads: int = 0
    """torch CPU threads (0 = torch's default). Tiny models run fastest on 1, and do not fight neighbours."""
    teacher: ModelConfig = field(default_factory=ModelConfig)
    student: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    config_dir: str = field(default=".", metadata={"internal": True})
    """Folder of the YAML file (relative data paths resolve against it). Set by `load_config`."""

    def resolve_path(self, value: str) -> Path:
        if value.startswith("bundled:"):
            return BUNDLED_DIR / value[len("bundled:"):]
        p = Path(value).expanduser()
        return p if p.is_absolute() else Path(self.config_dir) / p

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# -------------------------------------------------------------------------------------------------
# parsing: dict -> dataclasses, naming the dotted key on every error

def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, key: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(value, inner[0], key)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise UserError(f"config: {key} must be a mapping, got {type(value).__name__}")
        return _build(tp, value, key + ".")
    if origin is list:
        (item,) = typing.get_args(tp)
        if not isinstance(value, list):
            raise UserError(f"config: {key} must be a list of {_type_name(item)}, got {value!r}")
        return [_coerce(v, item, f"{key}[{i}]") for i, v in enumerate(value)]
    if tp is dict:
        if not isinstance(value, dict):
            raise UserError(f"config: {key} must be a mapping, got {type(value).__name__}")
        return dict(value)
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            hint = " (YAML reads 1e-3 as a string: write 1.0e-3)" if isinstance(value, str) else ""
            raise UserError(f"config: {key} must be a number, got {value!r}{hint}")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise UserError(f"config: {key} must be an integer, got {value!r}")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise UserError(f"config: {key} must be a string, got {value!r}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise UserError(f"config: {key} must be true or false, got {value!r}")
        return value
    raise TypeError(f"unsupported config type {tp!r} at {key}")


def _build(cls: Any, data: dict, prefix: str = "") -> Any:
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if not f.metadata.get("internal")}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise UserError(f"config: unknown key {prefix}{unknown[0]} (valid here: {', '.join(fields)})")
    kwargs = {name: _coerce(value, hints[name], prefix + name) for name, value in data.items()}
    return cls(**kwargs)


def _check(cfg: DistillConfig) -> None:
    """Impossible combinations, each refused with the dotted key and the valid range."""
    def need(ok: bool, msg: str) -> None:
        if not ok:
            raise UserError(f"config: {msg}")

    need(cfg.device in ("cpu", "cuda", "auto"), f"device must be cpu, cuda or auto, got {cfg.device!r}")
    need(cfg.precision in ("fp32", "bf16", "fp16"), f"precision must be fp32, bf16 or fp16, got {cfg.precision!r}")
    need(cfg.cpu_threads >= 0, f"cpu_threads must be >= 0 (0 = default), got {cfg.cpu_threads}")
    need(not (cfg.precision == "fp16" and cfg.device == "cpu"), "precision fp16 needs device cuda (use bf16 on cpu)")
    for side in ("teacher", "student"):
        m: ModelConfig = getattr(cfg, side)
        need((m.path is None) != (m.arch is None), f"{side}: give exactly one of {side}.path and {side}.arch")
        need(not (m.path and m.build), f"{side}.build only applies to {side}.arch (a random-init build)")
        need("vocab_size" not in m.build, f"{side}.build.vocab_size comes from the tokenizer; remove it")
        need(m.vocab_size >= 300, f"{side}.vocab_size must be >= 300 (256 bytes + specials), got {m.vocab_size}")
    t = cfg.train
    for name in ("batch_size", "grad_accum", "max_steps", "log_every", "eval_every", "save_every"):
        need(getattr(t, name) >= 1, f"train.{name} must be >= 1, got {getattr(t, name)}")
    need(t.patience >= 0, f"train.patience must be >= 0 (0 = off), got {t.patience}")
    need(cfg.data.window_chars >= 16, f"data.window_chars must be >= 16, got {cfg.data.window_chars}")
    need(cfg.data.eval_windows >= 0, f"data.eval_windows must be >= 0 (0 = all), got {cfg.data.eval_windows}")
    need(cfg.data.teacher_cache is None or cfg.data.teacher_cache.strip() != "",
         "data.teacher_cache is empty: give the cache folder (`trainguard distill cache build CONFIG --out DIR`) "
         "or remove the key to distil from the teacher online")
    lo = cfg.loss
    need(not (cfg.data.teacher_cache and max(lo.hidden.start, lo.hidden.end) > 0),
         "data.teacher_cache holds no hidden states: set loss.hidden.start and .end to 0")
    need(lo.lm > 0, f"loss.lm must be > 0: the LM loss is always on (got {lo.lm})")
    need(not (max(lo.balance.start, lo.balance.end) > 0 and max(lo.routing.start, lo.routing.end) == 0),
         "loss.balance weighs the student-aware router, which only exists with loss.routing on")
    need(0 < lo.routing.depth <= 1, f"loss.routing.depth must lie in (0, 1], got {lo.routing.depth}")
    need(not (cfg.data.teacher_cache and max(lo.routing.start, lo.routing.end) > 0),
         "data.teacher_cache holds no routing: set loss.routing.start and .end to 0")
    for name in ("kd", "hidden", "routing", "balance"):
        term: TermConfig = getattr(lo, name)
        need(term.start >= 0 and term.end >= 0, f"loss.{name}.start and .end must be >= 0")
        need(len(term.ramp) == 2 and 0 <= term.ramp[0] <= term.ramp[1] <= 1,
             f"loss.{name}.ramp must be [from, to] with 0 <= from <= to <= 1, got {term.ramp}")
    need(lo.kd.top_k >= 1, f"loss.kd.top_k must be >= 1, got {lo.kd.top_k}")
    need(lo.kd.temperature > 0, f"loss.kd.temperature must be > 0, got {lo.kd.temperature}")
    need(lo.kd.positions in ("context", "next_token"),
         f"loss.kd.positions must be context or next_token, got {lo.kd.positions!r}")
    need(lo.kd.chunk >= 1, f"loss.kd.chunk must be >= 1, got {lo.kd.chunk}")
    need(lo.kd.method in KD_METHODS, f"loss.kd.method must be one of {', '.join(KD_METHODS)}, got {lo.kd.method!r}")
    need(lo.kd.vocab_map in (None, "strict", "merge"), f"loss.kd.vocab_map must be strict or merge, got {lo.kd.vocab_map!r}")
    need(not (lo.kd.vocab_map == "merge" and lo.kd.method != "kl"),
         f"loss.kd.vocab_map merge applies to method kl only (method {lo.kd.method} maps ids one by one or not at all)")
    need(lo.kd.target_prob in ("mapped", "chain"), f"loss.kd.target_prob must be mapped or chain, got {lo.kd.target_prob!r}")
    need(not (lo.kd.target_prob == "chain" and lo.kd.method != "kl"),
         f"loss.kd.target_prob chain applies to method kl only, got method {lo.kd.method}")
    need(not (lo.kd.target_prob == "chain" and cfg.data.teacher_cache),
         "loss.kd.target_prob chain needs the teacher's log-probs at every position; data.teacher_cache has top-k at aligned ones")
    need(not (lo.kd.partial and lo.kd.method != "kl"), f"loss.kd.partial applies to method kl only, got {lo.kd.method}")
    need(not (lo.kd.renormalize and lo.kd.method != "kl"),
         f"loss.kd.renormalize applies to method kl only (method {lo.kd.method} has no tail term)")
    need(not (cfg.data.teacher_cache and lo.kd.method != "kl"),
         f"data.teacher_cache holds mapped top-k targets for method kl; loss.kd.method {lo.kd.method} "
         "needs the teacher's logits or hidden states")
    need(lo.hidden.norm in ("cosine", "standardize"),
         f"loss.hidden.norm must be cosine or standardize, got {lo.hidden.norm!r}")
    need(all(0 < d <= 1 for d in lo.hidden.depths), f"loss.hidden.depths must lie in (0, 1], got {lo.hidden.depths}")
    need(bool(lo.hidden.depths) or max(lo.hidden.start, lo.hidden.end) == 0,
         "loss.hidden has a weight but no depths")
    o = cfg.optim
    need(o.lr > 0 and o.proj_lr > 0, "optim.lr and optim.proj_lr must be > 0")
    need(0 <= o.min_lr_ratio <= 1, f"optim.min_lr_ratio must be in [0, 1], got {o.min_lr_ratio}")
    need(0 <= o.warmup_steps < t.max_steps,
         f"optim.warmup_steps must be in [0, train.max_steps), got {o.warmup_steps} of {t.max_steps}")
    need(len(o.betas) == 2 and all(0 <= b < 1 for b in o.betas), f"optim.betas must be two numbers in [0, 1), got {o.betas}")
    need(o.clip >= 0, f"optim.clip must be >= 0 (0 = off), got {o.clip}")
    if t.patience:
        # Early stopping while a weight still ramps compares evaluations of different objectives.
        ramp_end = max(lo.kd.ramp[1], lo.hidden.ramp[1], lo.routing.ramp[1], lo.balance.ramp[1]) * t.max_steps
        need(t.patience * t.eval_every >= ramp_end,
             f"train.patience={t.patience} evaluations x train.eval_every={t.eval_every} = "
             f"{t.patience * t.eval_every} steps is shorter than the curriculum's ramp ({ramp_end:.0f} steps)")


def parse_config(data: Any, config_dir: str | Path = ".") -> DistillConfig:
    """A checked `DistillConfig` from a parsed YAML mapping."""
    if not isinstance(data, dict):
        raise UserError(f"config: the top level must be a mapping, got {type(data).__name__}")
    cfg = _build(DistillConfig, data)
    cfg.config_dir = str(config_dir)
    _check(cfg)
    kd = cfg.loss.kd  # the cross-tokenizer defaults, resolved once the explicit values are known to be valid
    if kd.vocab_map is None:
        kd.vocab_map = "merge" if kd.method == "kl" else "strict"
    if kd.partial is None:
        kd.partial = kd.method == "kl"  # a teacher cache holds partial rows too (format 2; cache.py)
    return cfg


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> DistillConfig:
    """Reads and checks a YAML config; `overrides` are dotted keys (`train.max_steps`) applied first."""
    import yaml

    p = Path(path)
    if not p.is_file():
        raise UserError(f"config: no such file: {p}")
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or type(exc).__name__
        raise UserError(f"config: {p} is not valid YAML{where}: {problem}") from None
    data = {} if data is None else data
    for key, value in (overrides or {}).items():
        node = data
        *parents, leaf = key.split(".")
        for name in parents:
            node = node.setdefault(name, {})
        node[leaf] = value
    return parse_config(data, config_dir=p.parent.resolve())
