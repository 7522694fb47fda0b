"""Alignment by byte offsets on hard strings: Unicode, runs of spaces, digits, leading spaces, BOS/EOS.

Each model sees its own tokenisation of the same text (failure 2); pairs are only made where both
have read exactly the same bytes (failure 3): no interpolation, no truncation.
"""

from __future__ import annotations

import pytest

from trainguard.recipes.distill.data import collate, prepare
from trainguard.recipes.distill.tokenize_align import align, encode, token_lengths

HARD_STRINGS = [
    "héllo wörld, naïve café",
    "東京と大阪 🙂🙃 ok",
    "a    b\t\tc\n\n\nd",
    "   leading spaces and trailing   ",
    "1234567890 3.14159 2025-01-02 1,000,000",
    "text with <|eos|> and <|bos|> written in it <|endoftext|>",
    "Zoë   said: 12345 ¿qué? 東京 🙂  <|eos|>\n\n  leading  x",
    "x",
]


def _prefix_bytes(tok, ids):
    out = b""
    for i in ids:
        b = tok.token_bytes[i]
        out += b if b is not None else tok.backend.id_to_token(i).encode()
    return out


@pytest.mark.parametrize("text", HARD_STRINGS)
def test_pairs_see_identical_context_and_are_maximal(toks, text):
    t_tok, s_tok = toks
    s = encode(s_tok, text, token_lengths(s_tok))
    t = encode(t_tok, text, token_lengths(t_tok))
    # each side reproduces the text byte for byte from its own ids
    assert _prefix_bytes(s_tok, s.ids[1:]) == text.encode() == _prefix_bytes(t_tok, t.ids[1:])
    assert s.ids[0] == s_tok.bos_id and t.ids[0] == t_tok.bos_id
    pairs = align(s, t)
    assert pairs[0] == (0, 0)  # both bos positions predict the first token from nothing
    for p, q in pairs:
        assert _prefix_bytes(s_tok, s.ids[1: p + 1]) == _prefix_bytes(t_tok, t.ids[1: q + 1])
    # maximal: every shared boundary with a target on both sides is paired, nothing else
    common = set(s.ends[:-1]) & set(t.ends[:-1])
    assert {s.ends[p] for p, _ in pairs} == common
    assert len({p for p, _ in pairs}) == len(pairs) == len({q for _, q in pairs})


def test_multibyte_character_split_into_byte_tokens_still_aligns(toks):
    t_tok, s_tok = toks
    text = "ꙮ ꙮ"  # not in the training text: both tokenizers fall back to byte tokens
    s = encode(s_tok, text, token_lengths(s_tok))
    t = encode(t_tok, text, token_lengths(t_tok))
    char_ends = {0, 3, 4, 7}  # byte offsets of character boundaries
    assert set(s.ends) - char_ends  # the student has read part of a character at some position...
    pairs = align(s, t)
    assert {s.ends[p] for p, _ in pairs} - char_ends  # ...and such a position still aligns exactly


def test_batches_carry_each_models_own_ids(toks):
    t_tok, s_tok = toks
    texts = ["héllo wörld", "a    b 123"]
    batch = collate(prepare(texts, s_tok, t_tok), s_tok.bos_id, t_tok.bos_id)
    for b, text in enumerate(texts):
        n_s, n_t = int(batch["s_mask"][b].sum()), int(batch["t_mask"][b].sum())
        assert _prefix_bytes(s_tok, batch["s_ids"][b, 1:n_s].tolist()) == text.encode()
        assert _prefix_bytes(t_tok, batch["t_ids"][b, 1:n_t].tolist()) == text.encode()
    assert batch["s_pos"].numel() == batch["t_pos"].numel() > 0
    assert batch["n_bytes"] == sum(len(t.encode()) for t in texts)
