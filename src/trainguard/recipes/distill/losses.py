"""Every number the recipe trains on or reports, from one forward of both models.

`forward_losses` is the single forward used by training and evaluation alike (same code, same autocast
policy), so a number can never mean one thing in training and another in evaluation. It returns sums
and counts, not means, so evaluation can weight by tokens and training by the batch.

Terms:
- lm: the student's next-token cross-entropy (T = 1) on every position with a target;
- kd: sparse top-k KD (`kd.py`) on aligned positions only;
- hidden: student hidden states at relative depth d, projected student -> teacher (the teacher side is a
  fixed target, so a projection cannot shrink both sides to cheat), then compared normalised: 1 - cosine,
  or MSE of per-dimension standardised states. Both stay in [0, 4] whatever the hidden sizes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from trainguard.recipes.distill.build import body_and_head
from trainguard.recipes.distill.kd import TeacherTargets, sparse_kd, teacher_targets


@dataclass
class KDSpec:
    vocab_map: torch.Tensor  # teacher id -> student id or -1
    top_k: int
    temperature: float
    chunk: int
    layer_pairs: list[tuple[int, int]]  # (student hidden index, teacher hidden index)
    hidden_norm: str


def layer_pairs(depths: list[float], n_student: int, n_teacher: int) -> list[tuple[int, int]]:
    """Layers matched by relative depth: d -> (round(d * Ls), round(d * Lt)), indices into hidden_states."""
    return [(max(1, round(d * n_student)), max(1, round(d * n_teacher))) for d in depths]


def _standardize(x: torch.Tensor) -> torch.Tensor:
    return (x - x.mean(0, keepdim=True)) / (x.std(0, keepdim=True, unbiased=False) + 1e-5)


def hidden_loss(student_h: torch.Tensor, teacher_h: torch.Tensor, proj: Any, norm: str) -> torch.Tensor:
    """Summed per-position distance between projected student states and fixed teacher states [N, *]."""
    s = proj(student_h).float()
    t = teacher_h.detach().float()
    if norm == "cosine":
        return (1.0 - F.cosine_similarity(s, t, dim=-1, eps=1e-6)).sum()
    return ((_standardize(s) - _standardize(t)) ** 2).mean(-1).sum()


def _head_chunk(h: torch.Tensor, head: Any, labels: torch.Tensor, has_kd: torch.Tensor, sid: torch.Tensor,
                logp: torch.Tensor, mapped: torch.Tensor, tail: torch.Tensor, temperature: float,
                with_kd: bool) -> tuple[torch.Tensor, torch.Tensor]:
    logits = head(h).float()
    ce = F.cross_entropy(logits, labels, reduction="sum")
    if not with_kd:
        return ce, ce.new_zeros(())
    kd = sparse_kd(logits[has_kd], TeacherTargets(sid[has_kd], logp[has_kd], mapped[has_kd], tail[has_kd]),
                   temperature)
    return ce, kd.sum()


def forward_losses(student: Any, teacher: Any, projs: Any, batch: dict[str, Any], spec: KDSpec, *,
                   with_kd: bool = True, with_hidden: bool = True, full_kl: bool = False) -> dict[str, torch.Tensor]:
    """One forward of student (and teacher when a term needs it). Returns sums and counts:

    lm_sum, tokens, kd_sum, hidden_sum, aligned, positions, and kl_full_sum when `full_kl` (evaluation:
    the same loss with k = the whole teacher vocabulary, reported beside the top-k value, never in place).
    """
    s_body, s_head = body_and_head(student)
    need_hidden = with_hidden and bool(spec.layer_pairs)
    s_out = s_body(input_ids=batch["s_ids"], attention_mask=batch["s_mask"], output_hidden_states=need_hidden)
    hs = s_out.last_hidden_state.flatten(0, 1)
    labels = batch["labels"].flatten()
    valid = labels != -100
    s_pos, t_pos = batch["s_pos"], batch["t_pos"]
    out: dict[str, torch.Tensor] = {
        "tokens": valid.sum(), "aligned": s_pos.new_tensor(s_pos.numel()), "positions": valid.sum(),
    }
    zero = hs.new_zeros((), dtype=torch.float32)
    targets = None
    t_out = None
    if with_kd or need_hidden or full_kl:
        t_body, t_head = body_and_head(teacher)
        with torch.no_grad():
            t_out = t_body(input_ids=batch["t_ids"], attention_mask=batch["t_mask"], output_hidden_states=need_hidden)
        ht = t_out.last_hidden_state.flatten(0, 1)[t_pos]
        V_s = s_head.weight.shape[0]
        if with_kd or full_kl:
            targets = teacher_targets(ht, t_head, spec.vocab_map, spec.top_k, spec.temperature, V_s, spec.chunk)
        if full_kl:
            full = teacher_targets(ht, t_head, spec.vocab_map, t_head.weight.shape[0], spec.temperature, V_s, spec.chunk)
            with torch.no_grad():
                s_logits = torch.cat([s_head(c) for c in hs[s_pos].split(spec.chunk)])
                out["kl_full_sum"] = sparse_kd(s_logits, full, spec.temperature).sum()

    # LM CE and KD share each chunk's student logits; under autograd a chunk's logits are recomputed in
    # backward (checkpoint) rather than kept, so at most one chunk of [c, V_s] logits is alive at a time.
    M = hs.shape[0]
    has_kd = torch.zeros(M, dtype=torch.bool, device=hs.device)
    k = targets.sid.shape[1] if targets is not None else 1
    sid = torch.zeros((M, k), dtype=torch.long, device=hs.device)
    logp = torch.zeros((M, k), dtype=torch.float32, device=hs.device)
    mapped = torch.zeros((M, k), dtype=torch.bool, device=hs.device)
    tail = torch.full((M,), float("-inf"), dtype=torch.float32, device=hs.device)
    if targets is not None:
        has_kd[s_pos] = True
        sid[s_pos], logp[s_pos], mapped[s_pos], tail[s_pos] = targets.sid, targets.logp, targets.mapped, targets.tail
    rows = valid.nonzero().squeeze(-1)
    lm_sum, kd_sum = zero, zero
    use_kd = with_kd and targets is not None
    for c in rows.split(spec.chunk):
        args = (hs[c], s_head, labels[c], has_kd[c], sid[c], logp[c], mapped[c], tail[c], spec.temperature, use_kd)
        if torch.is_grad_enabled():
            ce, kd = checkpoint(_head_chunk, *args, use_reentrant=False)
        else:
            ce, kd = _head_chunk(*args)
        lm_sum, kd_sum = lm_sum + ce, kd_sum + kd
    out["lm_sum"], out["kd_sum"] = lm_sum, kd_sum

    hid = zero
    if need_hidden and t_out is not None and s_pos.numel():
        for proj, (ls, lt) in zip(projs, spec.layer_pairs):
            s_h = s_out.hidden_states[ls].flatten(0, 1)[s_pos]
            t_h = t_out.hidden_states[lt].flatten(0, 1)[t_pos]
            hid = hid + hidden_loss(s_h, t_h, proj, spec.hidden_norm) / len(spec.layer_pairs)
    out["hidden_sum"] = hid
    return out

