"""Teacher ids -> student ids through the exact-string overlap of the two vocabularies.

Index i means a different token in each vocabulary, so teacher logits are never truncated, padded or
projected through a dense V_t x V_s matrix (151,936 x 49,152 would be 7.5 B parameters). A teacher id
maps to the student id that stands for exactly the same bytes (space markers already normalised by
`build.token_bytes_table`); ids with no counterpart map to -1 and their probability mass is kept as
one tail term by the KD loss. With the same tokenizer on both sides every id maps to itself.
"""

from __future__ import annotations

from typing import Any


def build_vocab_map(teacher_bytes: list[bytes | None], student_bytes: list[bytes | None],
                    teacher_width: int) -> Any:
    """A LongTensor [teacher_width]: the student id of each teacher id, or -1.

    `teacher_width` is the teacher's logit width (it may exceed its tokenizer: padded embeddings never map).
    """
    import torch

    by_bytes: dict[bytes, int] = {}
    for sid, b in enumerate(student_bytes):
        if b is not None and b not in by_bytes:  # first id wins: the map stays one-to-one
            by_bytes[b] = sid
    out = torch.full((teacher_width,), -1, dtype=torch.long)
    taken: set[int] = set()
    for tid, b in enumerate(teacher_bytes[:teacher_width]):
        sid = by_bytes.get(b) if b is not None else None
        if sid is not None and sid not in taken:
            out[tid] = sid
            taken.add(sid)
    return out
