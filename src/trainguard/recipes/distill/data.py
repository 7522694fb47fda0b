"""Text windows, tokenised once by both tokenizers, and the padded batches the loop consumes.

A window is a run of about `window_chars` characters cut at whitespace. Training windows are visited
in a seeded permutation per epoch, so the data position is just (epoch, index) and a resumed run reads
exactly the batches an uninterrupted one would. Evaluation uses the first N windows of the held-out
text, always the same ones.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainguard.errors import UserError
from trainguard.recipes.distill.build import Tok
from trainguard.recipes.distill.tokenize_align import Encoded, align, encode, span_ends, token_lengths


def read_text(path: Path) -> str:
    if not path.is_file():
        raise UserError(f"data: no such file: {path}")
    # NFC once, here: both tokenizers then read identical characters, whatever their own normalisers do.
    try:
        return unicodedata.normalize("NFC", path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise UserError(f"data: {path} is not UTF-8 text (byte {exc.start}: {exc.reason}); give a UTF-8 text file") from None
    except OSError as exc:
        raise UserError(f"data: cannot read {path}: {exc.strerror}") from None


def windows(text: str, size: int) -> list[str]:
    """Consecutive pieces of about `size` characters, each ending just before a whitespace."""
    out, start = [], 0
    while start < len(text):
        end = min(start + size, len(text))
        if end < len(text):
            cut = text.rfind(" ", start + size // 2, end)
            end = cut if cut > start else end
        piece = text[start:end]
        if piece.strip():
            out.append(piece)
        start = end
    return out


@dataclass
class Example:
    student: Encoded
    teacher: Encoded
    pairs: list[tuple[int, int]]
    index: int = -1  # window number in its text (the offline cache's key)
    spans: list[int] | None = None  # per pair: teacher position where the student's next token ends, or -1
    partial: list[tuple[int, int, list[int], list[int]]] | None = None  # partial.py: (p, q0, teacher ids, student ids)


def prepare(texts: list[str], s_tok: Tok, t_tok: Tok, same_next: bool = False, partial: Any = None) -> list[Example]:
    """Both encodings and the aligned pairs of each text; with a `partial.PartialMapper`, also the
    positions that end inside a teacher token and what the teacher's ids mean there."""
    s_len, t_len = token_lengths(s_tok), token_lengths(t_tok)
    out = []
    for i, text in enumerate(texts):
        s, t = encode(s_tok, text, s_len), encode(t_tok, text, t_len)
        pairs = align(s, t, same_next)
        ex = Example(student=s, teacher=t, pairs=pairs, index=i, spans=span_ends(s, t, pairs))
        if partial is not None:
            from trainguard.recipes.distill.partial import partial_positions

            rows = partial_positions(s.ends, t.ends, {p for p, _ in pairs}, text.encode("utf-8"))
            ex.partial = [(p, q0, *partial.resolve(c)) for p, q0, c in rows]
        out.append(ex)
    return out


def collate(examples: list[Example], pad_s: int, pad_t: int) -> dict[str, Any]:
    """Right-padded tensors plus the flat indices of the aligned (student, teacher) positions."""
    import torch

    B = len(examples)
    Ls = max(len(e.student.ids) for e in examples)
    Lt = max(len(e.teacher.ids) for e in examples)
    s_ids = torch.full((B, Ls), pad_s, dtype=torch.long)
    t_ids = torch.full((B, Lt), pad_t, dtype=torch.long)
    s_mask = torch.zeros((B, Ls), dtype=torch.long)
    t_mask = torch.zeros((B, Lt), dtype=torch.long)
    labels = torch.full((B, Ls), -100, dtype=torch.long)
    s_pos: list[int] = []
    t_pos: list[int] = []
    t_span: list[int] = []
    for b, e in enumerate(examples):
        ns, nt = len(e.student.ids), len(e.teacher.ids)
        s_ids[b, :ns] = torch.tensor(e.student.ids)
        t_ids[b, :nt] = torch.tensor(e.teacher.ids)
        s_mask[b, :ns] = 1
        t_mask[b, :nt] = 1
        labels[b, : ns - 1] = torch.tensor(e.student.ids[1:])
        s_pos.extend(b * Ls + p for p, _ in e.pairs)
        t_pos.extend(b * Lt + q for _, q in e.pairs)
        t_span.extend(b * Lt + q2 if q2 >= 0 else -1 for q2 in (e.spans or [-1] * len(e.pairs)))
    extra: dict[str, Any] = {}
    if any(e.partial for e in examples):
        rows = [(b, p, q0, tids, sids) for b, e in enumerate(examples) for p, q0, tids, sids in (e.partial or [])]
        K = max(len(r[3]) for r in rows)
        extra = {"s_part": torch.tensor([b * Ls + p for b, p, *_ in rows], dtype=torch.long),
                 "t_part": torch.tensor([b * Lt + q0 for b, _, q0, *_ in rows], dtype=torch.long),
                 "part_tid": torch.tensor([r[3] + [-1] * (K - len(r[3])) for r in rows], dtype=torch.long),
                 "part_sid": torch.tensor([r[4] + [-1] * (K - len(r[4])) for r in rows], dtype=torch.long)}
    return {
        **extra,
        "s_ids": s_ids, "s_mask": s_mask, "labels": labels, "t_ids": t_ids, "t_mask": t_mask,
        "s_pos": torch.tensor(s_pos, dtype=torch.long), "t_pos": torch.tensor(t_pos, dtype=torch.long),
        "t_span": torch.tensor(t_span, dtype=torch.long),  # flat teacher position ending the student's next token
        "n_bytes": sum(e.student.n_bytes for e in examples),
        "windows": [(e.index, [q for _, q in e.pairs]) for e in examples],  # for the offline cache
        "partial_windows": [(e.index, len(e.partial or [])) for e in examples],  # its partial rows, in s_part order
    }


def train_batches(examples: list[Example], batch_size: int, seed: int, epoch: int, index: int,
                  pad_s: int, pad_t: int) -> Iterator[tuple[int, int, dict[str, Any]]]:
    """Yields (epoch, next index, batch) from data position (epoch, index) onwards, forever."""
    import torch

    if len(examples) < batch_size:
        raise UserError(f"data: {len(examples)} training windows, fewer than train.batch_size={batch_size}")
    while True:
        g = torch.Generator().manual_seed(seed * 100_003 + epoch)
        order = torch.randperm(len(examples), generator=g).tolist()
        while index + batch_size <= len(order):
            batch = [examples[i] for i in order[index: index + batch_size]]
            index += batch_size
            yield epoch, index, collate(batch, pad_s, pad_t)
        epoch, index = epoch + 1, 0


def eval_batches(examples: list[Example], batch_size: int, pad_s: int, pad_t: int) -> Iterator[dict[str, Any]]:
    for i in range(0, len(examples), batch_size):
        yield collate(examples[i: i + batch_size], pad_s, pad_t)


def to_device(batch: dict[str, Any], device: Any) -> dict[str, Any]:
    return {k: v.to(device, non_blocking=True) if hasattr(v, "to") else v for k, v in batch.items()}
