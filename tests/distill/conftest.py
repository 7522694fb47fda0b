"""Shared fixtures for the distillation tests: tiny tokenizers, tiny configs, one shared short run.

    pytest tests/distill -q

Everything is real: tokenizers trained here with `tokenizers`, random-init Hugging Face models
(a Qwen2-MoE shaped teacher, a Llama shaped student), the real loop under the real guard, on the CPU.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

import yaml  # noqa: E402

from trainguard.recipes.distill import BUNDLED_CONFIG  # noqa: E402
from trainguard.recipes.distill.config import parse_config  # noqa: E402
from trainguard.recipes.distill.corpus import DATA_DIR  # noqa: E402

HARD = "Zoë   said: 12345 ¿qué? 東京 🙂  <|eos|>\n\n  leading  x"


@pytest.fixture(scope="session")
def small_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 24 kB slice of the shipped corpus, plus a line of hard strings: keeps setup fast."""
    d = tmp_path_factory.mktemp("corpus")
    text = (DATA_DIR / "tiny_train.txt").read_text(encoding="utf-8")[:24_000]
    (d / "train.txt").write_text(text + "\n" + HARD + "\n", encoding="utf-8")
    return d / "train.txt"


@pytest.fixture(scope="session")
def base_dict(small_corpus: Path) -> dict:
    data = yaml.safe_load(BUNDLED_CONFIG.read_text())
    data["data"]["train"] = str(small_corpus)
    data["data"]["eval_windows"] = 8
    data["train"].update(max_steps=8, eval_every=4, save_every=4, log_every=4, batch_size=4, grad_accum=2)
    data["optim"]["warmup_steps"] = 2
    return data


@pytest.fixture
def make_cfg(base_dict: dict):
    def make(**over: object):
        d = copy.deepcopy(base_dict)
        for key, value in over.items():
            node = d
            *parents, leaf = key.split("__")
            for name in parents:
                node = node[name]
            node[leaf] = value
        return parse_config(d)
    return make


@pytest.fixture(scope="session")
def shared_run(base_dict: dict, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One short end-to-end run (8 optimizer steps, 2 evaluations) that several tests inspect."""
    from trainguard.recipes.distill.train import train

    cfg = parse_config(copy.deepcopy(base_dict))
    result = train(cfg, run_dir=tmp_path_factory.mktemp("run"), verbose=False)
    result["cfg"] = cfg
    return result


@pytest.fixture(scope="session")
def toks(small_corpus: Path):
    """Two byte-level BPE tokenizers of different sizes trained on the same text."""
    from trainguard.recipes.distill.build import load_tokenizer
    from trainguard.recipes.distill.config import ModelConfig

    text = small_corpus.read_text(encoding="utf-8")
    teacher = load_tokenizer("teacher", ModelConfig(arch="qwen2", vocab_size=600, split_digits=True), text)
    student = load_tokenizer("student", ModelConfig(arch="llama", vocab_size=330), text)
    return teacher, student
