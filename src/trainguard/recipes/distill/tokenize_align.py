"""Both models read the same text, each through its own tokenizer; positions are aligned by offsets.

Offsets are counted in UTF-8 bytes of the text, computed from the bytes each token stands for (not
from a tokenizer's offset mapping, which trims spaces and splits characters differently per library).
A byte offset is finer than a character offset: a character cut across two byte tokens still aligns.

Position p of a model's input ([bos] + ids) predicts token p+1 from the text up to byte E(p), with
E(0) = 0 and E(p) = the end of token p. Student position p and teacher position q see exactly the same
context when E_s(p) == E_t(q): these are the ends of the exact-match groups (the shortest spans that
both tokenisations cover with whole tokens). Only such pairs are distilled; every other student
position is left out of KD and counted, and `align_ratio` reports the aligned share. No position is
ever interpolated or truncated into place.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainguard.errors import UserError
from trainguard.recipes.distill.build import Tok


@dataclass
class Encoded:
    """One text through one tokenizer: input ids ([bos] + text ids) and each position's context end."""

    ids: list[int]
    ends: list[int]  # ends[p] = bytes of text seen by position p (ends[0] = 0: only bos)
    n_bytes: int


def token_lengths(tok: Tok) -> list[int]:
    """Bytes covered by each id; a special token written in the text covers its own literal bytes."""
    lengths = [len(b) if b is not None else -1 for b in tok.token_bytes]
    for idx, added in tok.backend.get_added_tokens_decoder().items():
        if idx < len(lengths):
            lengths[idx] = len(added.content.encode("utf-8"))
    return lengths


def encode(tok: Tok, text: str, lengths: list[int]) -> Encoded:
    """[bos] + the tokens of `text`, with the byte offset each position has read up to."""
    ids = tok.encode(text)
    ends = [0]
    for i in ids:
        n = lengths[i] if i < len(lengths) else -1
        if n < 0:
            raise UserError(f"{tok.name} tokenizer: id {i} has no known bytes; cannot align offsets")
        ends.append(ends[-1] + n)
    n_bytes = len(text.encode("utf-8"))
    if ends[-1] != n_bytes:
        # A normaliser or a lossy pre-tokenizer changed the text: offsets would no longer mean the same
        # thing on both sides, so refuse instead of guessing.
        raise UserError(f"{tok.name} tokenizer does not reproduce the text byte for byte "
                        f"({ends[-1]} of {n_bytes} bytes); use a byte-level tokenizer without a normaliser")
    return Encoded(ids=[tok.bos_id, *ids], ends=ends, n_bytes=n_bytes)


def align(student: Encoded, teacher: Encoded, same_next: bool = False) -> list[tuple[int, int]]:
    """(student position, teacher position) pairs with the same context, among positions with a target.

    With `same_next`, only pairs whose next tokens are also the same string (the next exact-match
    group is one token on each side). The last position of each side has no next token and is never paired.
    """
    t_at = {e: q for q, e in enumerate(teacher.ends[:-1])}
    pairs = [(p, t_at[e]) for p, e in enumerate(student.ends[:-1]) if e in t_at]
    if same_next:
        pairs = [(p, q) for p, q in pairs if student.ends[p + 1] == teacher.ends[q + 1]]
    return pairs


def span_ends(student: Encoded, teacher: Encoded, pairs: list[tuple[int, int]]) -> list[int]:
    """Per pair (p, q): the teacher position q2 whose context ends where the student's next token ends, or -1.

    When q2 exists, the teacher tokens q+1..q2 spell exactly the student's next token, so the teacher's
    probability of that token is the product of its probabilities of those tokens (the chain rule).
    """
    t_at = {e: q for q, e in enumerate(teacher.ends)}
    return [t_at.get(student.ends[p + 1], -1) for p, _ in pairs]
