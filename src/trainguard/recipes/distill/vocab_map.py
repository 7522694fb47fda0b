"""Teacher ids -> student ids through the exact-string overlap of the two vocabularies.

Index i means a different token in each vocabulary, so teacher logits are never truncated, padded or
projected through a dense V_t x V_s matrix (151,936 x 49,152 would be 7.5 B parameters). A teacher id
maps to the student id that stands for exactly the same bytes (space markers already normalised by
`build.token_bytes_table`) and whose longer extensions are the same in both vocabularies (so "the next
token is x" is the same event on both sides); ids with no such counterpart map to -1 and their
probability mass is kept as one tail term by the KD loss. With the same tokenizer on both sides every
id maps to itself.

Why the extension check (measured on the bundled corpus, benchmarks/distill_quality.py): without it a
teacher that has ' the' but not ' there' puts the mass of "there" on ' the', and the student, which
has ' there', is taught to say ' the' where its own data says ' there'; cross-tokenizer KD then ended
worse than LM alone (0.787 vs 0.653 bits per byte); with it, 0.681.

`mode="merge"` goes further and is exact about events rather than strings (many-to-one): the student's
next token is the longest student token the text continues with (BPE is close to that), so a teacher id
whose text is t means "the student reads first the longest student token that t starts with" -- provided
no student token longer than t starts with t unless the teacher has it too (then the teacher's id, which
already excludes that longer text, cannot be followed into it on the student side). A teacher ' there'
whose student has no ' there' adds its mass to the student's ' the'; a teacher ' the' whose student also
has ' there' (the teacher not) is ambiguous and joins the tail. Several teacher ids then share one
student id: their probabilities are summed (`losses.merge_duplicates`).
"""

from __future__ import annotations

import bisect
from typing import Any


def _extensions(sorted_strings: list[bytes], x: bytes) -> list[bytes]:
    """The strings of a sorted list that start with x (x included): one contiguous range."""
    lo = bisect.bisect_left(sorted_strings, x)
    hi = lo
    while hi < len(sorted_strings) and sorted_strings[hi].startswith(x):
        hi += 1
    return sorted_strings[lo:hi]


MODES = ("strict", "merge")


def _merge_map(teacher_bytes: list[bytes | None], by_bytes: dict[bytes, int], s_sorted: list[bytes],
               teacher_width: int) -> Any:
    import torch

    t_set = {b for b in teacher_bytes if b is not None}
    out = torch.full((teacher_width,), -1, dtype=torch.long)
    for tid, b in enumerate(teacher_bytes[:teacher_width]):
        if not b:
            continue
        if any(x != b and x not in t_set for x in _extensions(s_sorted, b)):
            continue  # the student may read a longer token here that the teacher's id does not rule out
        for n in range(len(b), 0, -1):  # the longest student token the text starts with
            sid = by_bytes.get(b[:n])
            if sid is not None:
                out[tid] = sid
                break
    return out


def build_vocab_map(teacher_bytes: list[bytes | None], student_bytes: list[bytes | None],
                    teacher_width: int, prefix_consistent: bool = True, mode: str = "strict") -> Any:
    """A LongTensor [teacher_width]: the student id of each teacher id, or -1.

    `teacher_width` is the teacher's logit width (it may exceed its tokenizer: padded embeddings never map).
    mode "strict": one-to-one, identical strings with identical extensions; "merge": many-to-one by event.
    """
    import torch

    if mode not in MODES:
        raise ValueError(f"vocabulary map mode must be one of {MODES}, got {mode!r}")
    by_bytes: dict[bytes, int] = {}
    for sid, b in enumerate(student_bytes):
        if b is not None and b not in by_bytes:  # first id wins: the map stays one-to-one
            by_bytes[b] = sid
    t_sorted = sorted({b for b in teacher_bytes if b is not None})
    s_sorted = sorted(by_bytes)
    if mode == "merge":
        return _merge_map(teacher_bytes, by_bytes, s_sorted, teacher_width)
    out = torch.full((teacher_width,), -1, dtype=torch.long)
    taken: set[int] = set()
    for tid, b in enumerate(teacher_bytes[:teacher_width]):
        match = by_bytes.get(b) if b is not None else None
        if b is None or match is None or match in taken:
            continue
        # Same string is not yet same event: "next token is ' the'" excludes ' there' in a vocabulary
        # that has ' there' and includes it in one that has not. Only strings whose longer extensions are
        # the same in both vocabularies mean the same thing as next tokens; the others join the tail.
        if prefix_consistent and _extensions(t_sorted, b) != _extensions(s_sorted, b):
            continue
        out[tid] = match
        taken.add(match)
    return out
