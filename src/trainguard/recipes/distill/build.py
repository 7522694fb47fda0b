"""Teacher and student: each a Hugging Face causal LM with its own tokenizer, loaded or built locally.

Nothing is downloaded. A model comes from a local folder (`path`) or is built with random weights from
a `model_type` and config keywords (`arch` + `build`); a tokenizer comes from a local tokenizer.json or
is trained here as a byte-level BPE on the training text, so the bundled config runs on a fresh machine.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainguard.errors import UserError
from trainguard.recipes.distill.config import ModelConfig

SPECIALS = ["<|bos|>", "<|eos|>", "<|pad|>"]


@dataclass
class Tok:
    """What the recipe needs from a tokenizer: ids of a text, and the exact bytes each id stands for."""

    name: str
    backend: Any  # a `tokenizers.Tokenizer`
    token_bytes: list[bytes | None]  # bytes of each id; None for special tokens (they cover no text)
    bos_id: int

    @property
    def vocab_size(self) -> int:
        return len(self.token_bytes)

    def encode(self, text: str) -> list[int]:
        return self.backend.encode(text, add_special_tokens=False).ids


def _bytes_to_unicode() -> dict[str, int]:
    """GPT-2's byte-level alphabet, inverted: printable stand-in character -> byte."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def _is_byte_level(backend: Any) -> bool:
    spec = json.loads(backend.to_str())
    dec = spec.get("decoder") or {}
    decoders = dec.get("decoders", [dec]) if dec.get("type") == "Sequence" else [dec]
    return any(d.get("type") == "ByteLevel" for d in decoders)


def token_bytes_table(backend: Any) -> list[bytes | None]:
    """The bytes each id stands for, with the space markers normalised (Ġ and ▁ both become b" ").

    Byte-level vocabularies are decoded through GPT-2's alphabet; SentencePiece-style ones map ▁ to a
    space and <0xNN> to its byte. Special (added, special=True) tokens get None: they cover no text.
    """
    vocab: dict[str, int] = backend.get_vocab(with_added_tokens=True)
    specials = {t.content for t in backend.get_added_tokens_decoder().values() if t.special}
    size = max(vocab.values()) + 1
    table: list[bytes | None] = [None] * size
    byte_level = _is_byte_level(backend)
    inv = _bytes_to_unicode() if byte_level else {}
    for piece, idx in vocab.items():
        if piece in specials:
            continue
        if byte_level and all(ch in inv for ch in piece):
            table[idx] = bytes(inv[ch] for ch in piece)
        elif len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            table[idx] = bytes([int(piece[3:5], 16)])
        else:
            table[idx] = piece.replace("▁", " ").encode("utf-8")
    return table


def train_tokenizer(text: str, vocab_size: int, split_digits: bool = False) -> Any:
    """A byte-level BPE trained on `text`, with <|bos|>, <|eos|>, <|pad|> as special tokens.

    No offset trimming and no normaliser: the ids of a text decode to exactly its bytes.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.pre_tokenizer = (pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
                         if split_digits else byte_level)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([text], trainer=trainer)
    return tok


def _default_bos(folder: Path | None) -> str | None:
    if folder is None:
        return None
    cfg = folder / "tokenizer_config.json"
    if cfg.is_file():
        data = json.loads(cfg.read_text())
        for key in ("bos_token", "eos_token"):
            value = data.get(key)
            if isinstance(value, dict):
                value = value.get("content")
            if value:
                return value
    return None


def load_tokenizer(side: str, mc: ModelConfig, train_text: str, saved: str | None = None) -> Tok:
    """The tokenizer of one side: from `tokenizer`/`path`, else `saved` (a resumed run's own), else
    trained here on the training text (a second or two for the bundled corpus)."""
    from tokenizers import Tokenizer

    source = mc.tokenizer or mc.path
    folder = None
    if source:
        p = Path(source).expanduser()
        folder = p if p.is_dir() else p.parent
        file = p / "tokenizer.json" if p.is_dir() else p
    if saved is not None:
        backend = Tokenizer.from_str(saved)
    elif source:
        if not file.is_file():
            raise UserError(f"{side}: no tokenizer.json at {file}")
        backend = Tokenizer.from_file(str(file))
    else:
        backend = train_tokenizer(train_text, mc.vocab_size, mc.split_digits)
    bos = mc.bos or ("<|bos|>" if not source else _default_bos(folder))
    bos_id = backend.token_to_id(bos) if bos else None
    if bos_id is None:
        raise UserError(f"{side}.bos: token {bos!r} is not in the {side} tokenizer; set {side}.bos")
    return Tok(name=side, backend=backend, token_bytes=token_bytes_table(backend), bos_id=bos_id)


def check_arch(side: str, arch: str) -> None:
    """`arch` is a model type this transformers knows; else one line with the closest valid ones (transformers'
    own error lists all of them in one line of about 12,000 characters)."""
    import difflib

    from transformers import CONFIG_MAPPING

    known = sorted(CONFIG_MAPPING.keys())
    if arch in known:
        return
    close = difflib.get_close_matches(arch, known, n=4, cutoff=0.5)
    common = [a for a in ("llama", "qwen2", "qwen2_moe", "qwen3", "mistral", "gemma", "gpt2") if a in known]
    raise UserError(f"{side}.arch: {arch!r} is not a model type of this transformers"
                    + (f" (closest: {', '.join(close)})" if close else "")
                    + f"; valid: any of its {len(known)} model types, e.g. {', '.join(common)} "
                    "(all: python -c 'import transformers; print(*transformers.CONFIG_MAPPING)')")


def load_model(side: str, mc: ModelConfig, tok: Tok) -> Any:
    """A causal LM: from a local folder, or built with random weights sized to the tokenizer."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one line per step is the recipe's output, not loader bars
    model: Any  # whichever architecture the folder or `arch` names
    if mc.path:
        try:
            model = AutoModelForCausalLM.from_pretrained(mc.path, local_files_only=True)
        except (OSError, ValueError) as exc:
            raise UserError(f"{side}.path: cannot load a causal LM from {mc.path}: "
                            f"{str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__}") from None
    else:
        assert mc.arch is not None  # exactly one of path and arch (config.py)
        check_arch(side, mc.arch)
        try:
            config = AutoConfig.for_model(mc.arch, vocab_size=tok.vocab_size, **mc.build)
        except (ValueError, TypeError) as exc:
            raise UserError(f"{side}.arch/{side}.build: {exc}".splitlines()[0]) from None
        model = AutoModelForCausalLM.from_config(config)
    emb = model.get_input_embeddings().weight.shape[0]
    if emb < tok.vocab_size:
        raise UserError(f"{side}: the model has {emb} embeddings but its tokenizer {tok.vocab_size} ids")
    if getattr(model.get_output_embeddings(), "bias", None) is not None:
        raise UserError(f"{side}: output heads with a bias are not supported (the fused head reads lm_head.weight)")
    if getattr(model.config, "final_logit_softcapping", None):
        raise UserError(f"{side}: final_logit_softcapping models are not supported (logits come from lm_head)")
    return model


def body_and_head(model: Any) -> tuple[Any, Any]:
    """The decoder stack (returns hidden states) and the output projection, called separately so full
    logits are only ever made chunk by chunk."""
    return getattr(model, model.base_model_prefix), model.get_output_embeddings()


def num_layers(model: Any) -> int:
    return int(model.config.num_hidden_layers)
