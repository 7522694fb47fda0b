"""Sparse top-k knowledge distillation across vocabularies, computed chunk by chunk.

Teacher side (no grad): for each aligned position, the top-k of the tempered log-probs
log softmax(z_t / T) are kept, their ids mapped to student ids (`vocab_map`), and everything else
(the rest of the vocabulary and top-k ids with no student counterpart) becomes one tail term, computed
exactly from the full logits of that chunk. Only [N, k] values and ids survive the chunk, never the
[N, V_t] logits of the whole batch.

Student side: the same partition of the student's tempered distribution (each mapped id, then the
tail), and the loss is the KL between the two partitioned distributions times T^2:

    KD = T^2 * ( sum_i p_i (log p_i - log q_i) + p_tail (log p_tail - log q_tail) )

It is a true KL (>= 0). With the same tokenizer and k = vocabulary size every id maps, the tail is
empty, and it equals the full-vocabulary KL(p_T || q_T) * T^2 (tested).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

MASKED = -1.0e4  # finite "minus infinity" for masked logits: logsumexp stays finite, gradients stay NaN-free


@dataclass
class TeacherTargets:
    sid: torch.Tensor  # [N, k] student ids; V_s (one past the student vocabulary) where unmapped
    logp: torch.Tensor  # [N, k] tempered teacher log-probs; 0 where unmapped (masked by `mapped`)
    mapped: torch.Tensor  # [N, k] bool
    tail: torch.Tensor  # [N] log of the teacher mass outside the mapped top-k (-inf when none)


@torch.no_grad()
def teacher_targets(hidden: torch.Tensor, head: Any, vocab_map: torch.Tensor, k: int, temperature: float,
                    student_vocab: int, chunk: int) -> TeacherTargets:
    """Top-k tempered teacher log-probs at `hidden` [N, H_t], mapped into student ids, chunk by chunk."""
    sids, logps, maps, tails = [], [], [], []
    for i in range(0, hidden.shape[0], chunk):
        z = head(hidden[i: i + chunk]).float() / temperature  # [c, V_t]: the only full logits, one chunk
        lse = torch.logsumexp(z, dim=-1, keepdim=True)
        top, idx = z.topk(min(k, z.shape[-1]), dim=-1)
        sid = vocab_map[idx]
        mapped = sid >= 0
        # tail = everything except the mapped top-k entries: mask those, keep the rest of the row
        masked = z.scatter(-1, idx, torch.where(mapped, torch.full_like(top, float("-inf")), top))
        tails.append((torch.logsumexp(masked, dim=-1, keepdim=True) - lse).squeeze(-1))
        sids.append(torch.where(mapped, sid, student_vocab))
        logps.append(torch.where(mapped, top - lse, 0.0))
        maps.append(mapped)
    return TeacherTargets(torch.cat(sids), torch.cat(logps), torch.cat(maps), torch.cat(tails))


def sparse_kd(student_logits: torch.Tensor, t: TeacherTargets, temperature: float) -> torch.Tensor:
    """Per-position KD [n] between teacher targets and student logits [n, V_s] (same rows)."""
    z = student_logits.float() / temperature
    lse = torch.logsumexp(z, dim=-1, keepdim=True)
    ext = torch.cat([z, z.new_full((z.shape[0], 1), MASKED)], dim=-1)  # column V_s: where unmapped ids point
    q = ext.gather(-1, t.sid) - lse
    tail_s = torch.logsumexp(ext.scatter(-1, t.sid, MASKED), dim=-1) - lse.squeeze(-1)
    p = torch.where(t.mapped, t.logp.exp(), 0.0)
    body = (p * (t.logp - q)).sum(-1)
    has_tail = torch.isfinite(t.tail)
    p_tail = torch.where(has_tail, t.tail.exp(), 0.0)
    tail = p_tail * (torch.where(has_tail, t.tail, 0.0) - tail_s)
    return (body + tail) * temperature**2
