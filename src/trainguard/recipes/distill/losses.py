"""Every number the recipe trains on or reports, from one forward of both models.

`forward_losses` is the single forward used by training and evaluation alike (same code, same autocast
policy), so a number can never mean one thing in training and another in evaluation. It returns sums
and counts, not means, so evaluation can weight by tokens and training by the batch.

Terms:
- lm: the student's next-token cross-entropy (T = 1) on every position with a target;
- kd: sparse top-k KD (`kd.py`) on aligned positions only; across tokenizers `kd.method` may replace it
  with ULD, GOLD's hybrid or a teacher-to-student projection (`xtok.py`), and `correct_only` keeps only
  the rows where the teacher's top-1, as a student id, is the student's next token;
- hidden: student hidden states at relative depth d, projected student -> teacher (the teacher side is a
  fixed target, so a projection cannot shrink both sides to cheat), then compared normalised: 1 - cosine,
  or MSE of per-dimension standardised states. Both stay in [0, 4] whatever the hidden sizes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from trainguard.recipes.distill.build import body_and_head
from trainguard.recipes.distill.fused_head import head_losses
from trainguard.recipes.distill.kd import GraphedTargets, TeacherTargets, sparse_kd, teacher_targets
from trainguard.recipes.distill.routing import routing_kl
from trainguard.recipes.distill.xtok import xtok_kd


@dataclass
class KDSpec:
    vocab_map: torch.Tensor  # teacher id -> student id or -1
    top_k: int
    temperature: float
    chunk: int
    layer_pairs: list[tuple[int, int]]  # (student hidden index, teacher hidden index)
    hidden_norm: str
    graphed: GraphedTargets | None = None  # CUDA: the teacher's top-k walk replayed as a graph
    router: Any = None  # routing.StudentRouter when loss.routing is on
    teacher_routing: Any = None  # routing.TeacherRouting (hooks on the teacher's gates)
    route_layers: tuple[int, int] = (0, 0)  # (student hidden index, teacher gate index)
    method: str = "kl"  # kl (mapped top-k, fused_head) | uld | gold | t2s (xtok.py)
    correct_only: bool = False  # KD only where the teacher's top-1 (a student id) is the student's next token
    renormalize: bool = False  # kl: the teacher's mapped top-k renormalised to 1 (no tail term)
    t2s: Any = None  # xtok.TeacherToStudent when method is t2s
    partial: bool = False  # also distil positions inside a teacher token (partial.py)
    chain: bool = False  # kd.target_prob chain: the student's next token at the teacher's chain-rule probability
    merge: bool = False  # the vocabulary map is many-to-one (vocab_map mode merge): sum duplicate ids


def renormalized(t: TeacherTargets) -> TeacherTargets:
    """The mapped top-k's mass renormalised to 1 and the tail dropped (rows with no mapped id keep none)."""
    lse = torch.logsumexp(t.logp.masked_fill(~t.mapped, float("-inf")), dim=-1, keepdim=True)
    logp = torch.where(t.mapped, t.logp - torch.where(torch.isfinite(lse), lse, 0.0), 0.0)
    return TeacherTargets(t.sid, logp, t.mapped, torch.full_like(t.tail, float("-inf")))


def merge_duplicates(t: TeacherTargets, student_vocab: int) -> TeacherTargets:
    """Teacher ids that map to one student id (vocab_map mode merge) become one entry: probabilities summed.

    Entries come out sorted by student id; unmapped entries stay unmapped; the tail is unchanged (the
    mapped mass is the same). Sort-based: [N, k] work, no [N, V_s] buffer.
    """
    sid, order = t.sid.sort(-1)
    mapped = t.mapped.gather(-1, order)
    p = torch.where(mapped, t.logp.gather(-1, order).exp(), 0.0)
    first = torch.ones_like(mapped)
    first[:, 1:] = sid[:, 1:] != sid[:, :-1]
    group = first.long().cumsum(-1) - 1
    total = torch.zeros_like(p).scatter_add_(-1, group, p).gather(-1, group)
    keep = first & mapped
    return TeacherTargets(torch.where(keep, sid, student_vocab).to(t.sid.dtype),
                          torch.where(keep, total.clamp(min=1e-30).log(), 0.0), keep, t.tail)


@torch.no_grad()
def next_token_logprobs(h: torch.Tensor, head: Any, ids: torch.Tensor, temperature: float, chunk: int) -> torch.Tensor:
    """[B, L]: the teacher's tempered log-prob of its own next token at each position (0 at the last one)."""
    B, L = ids.shape
    flat = h.flatten(0, 1)
    nxt = torch.cat([ids[:, 1:], ids.new_zeros((B, 1))], dim=1).flatten()
    out = torch.empty(flat.shape[0], dtype=torch.float32, device=h.device)
    for i in range(0, flat.shape[0], chunk):
        z = head(flat[i: i + chunk]).float() / temperature
        out[i: i + chunk] = z.gather(-1, nxt[i: i + chunk, None]).squeeze(-1) - torch.logsumexp(z, dim=-1)
    out = out.view(B, L)
    out[:, -1] = 0.0
    return out


def span_logprobs(lp: torch.Tensor, start: torch.Tensor, end: torch.Tensor) -> torch.Tensor:
    """[N]: sum of lp [B, L] over flat positions start..end-1 of one row (prefix sums; garbage where end < 0)."""
    L = lp.shape[1]
    cum = torch.cat([lp.new_zeros((lp.shape[0], 1)), lp.cumsum(1)], dim=1).flatten()  # [B, L + 1]
    end = end.clamp(min=0)
    return cum[end + end // L] - cum[start + start // L]


def chain_targets(t: TeacherTargets, star: torch.Tensor, chain: torch.Tensor, has_span: torch.Tensor,
                  student_vocab: int) -> TeacherTargets:
    """The student's actual next token given the teacher's chain-rule probability of it (kd.target_prob chain).

    Through the map, the teacher's probability of the student's next token `star` is what one teacher
    position puts on ids that map to it; where that token is spelled by several teacher tokens, the mass
    is elsewhere (a teacher ' the' before 're' for a student ' there'), and the target understates the
    right token. Where the student's next token ends on a teacher boundary (`has_span`), its probability
    is set to exp(chain) (the product of the teacher's probabilities of the tokens spelling it), in an
    extra column, and every other entry and the tail are scaled so the whole still sums to 1.
    """
    is_star = t.mapped & (t.sid.long() == star[:, None])
    p = torch.where(t.mapped, t.logp.exp(), 0.0)
    p_star = (p * is_star).sum(-1)
    log_scale = (torch.log1p(-chain.exp().clamp(max=1 - 1e-6)) - torch.log1p(-p_star.clamp(max=1 - 1e-6)))
    log_scale = torch.where(has_span, log_scale, 0.0)
    mapped = t.mapped & ~(is_star & has_span[:, None])
    logp = torch.where(mapped, t.logp + log_scale[:, None], 0.0)
    tail = torch.where(torch.isfinite(t.tail), t.tail + log_scale, t.tail)
    sid = torch.where(mapped, t.sid, student_vocab).to(t.sid.dtype)
    extra_sid = torch.where(has_span, star, student_vocab).to(t.sid.dtype)
    return TeacherTargets(torch.cat([sid, extra_sid[:, None]], -1),
                          torch.cat([logp, torch.where(has_span, chain, 0.0)[:, None]], -1),
                          torch.cat([mapped, has_span[:, None]], -1), tail)


@torch.no_grad()
def consistent_logprobs(ht: torch.Tensor, head: Any, tid: torch.Tensor, temperature: float) -> torch.Tensor:
    """[R, K]: the teacher's tempered distribution at the last boundary (hidden ht [R, H_t]) conditioned on
    the ids consistent with the bytes read (tid, -1 padding): log-probs over those ids, -inf at padding.
    What a partial position distils; the offline cache stores exactly these values (cache_build.py)."""
    z = head(ht).float() / temperature
    real = tid >= 0
    lz = torch.where(real, z.gather(-1, tid.clamp(min=0)), float("-inf"))
    return lz - torch.logsumexp(lz, dim=-1, keepdim=True)


def partial_from_logprobs(logp: torch.Tensor, tid: torch.Tensor, sid: torch.Tensor, student_vocab: int) -> TeacherTargets:
    """Conditioned log-probs over consistent teacher ids (tid, -1 padding) as targets in student ids (sid, -1:
    the tail). The one mapping both the online teacher and the offline cache go through."""
    real = tid >= 0
    mapped = real & (sid >= 0)
    un = torch.where(real & ~mapped, logp, float("-inf"))
    return TeacherTargets(torch.where(mapped, sid, student_vocab).to(torch.int32), torch.where(mapped, logp, 0.0),
                          mapped, torch.logsumexp(un, dim=-1))


@torch.no_grad()
def partial_targets(ht: torch.Tensor, head: Any, tid: torch.Tensor, sid: torch.Tensor, temperature: float,
                    student_vocab: int) -> TeacherTargets:
    """Targets at positions inside a teacher token (partial.py): the teacher's distribution at the last
    boundary, conditioned on the ids consistent with the bytes read (tid, -1 padding), mapped through sid."""
    return partial_from_logprobs(consistent_logprobs(ht, head, tid, temperature), tid, sid, student_vocab)


def _pad_k(t: TeacherTargets, k: int, student_vocab: int) -> TeacherTargets:
    extra = k - t.sid.shape[1]
    if extra <= 0:
        return t
    n = t.sid.shape[0]
    return TeacherTargets(torch.cat([t.sid, t.sid.new_full((n, extra), student_vocab)], -1),
                          torch.cat([t.logp, t.logp.new_zeros((n, extra))], -1),
                          torch.cat([t.mapped, t.mapped.new_zeros((n, extra))], -1), t.tail)


def with_partial_rows(t: TeacherTargets, s_pos: torch.Tensor, batch: dict[str, Any], t_hidden: torch.Tensor | None,
                      t_head: Any, spec: KDSpec, student_vocab: int) -> tuple[TeacherTargets, torch.Tensor]:
    """The aligned rows' targets followed by those of the positions inside a teacher token, and their positions.

    The conditioned log-probs come from the offline cache (`part_logp` in the batch) or, online, from the
    teacher's hidden states `t_hidden` and head; either way they go through the same mapping."""
    if "part_logp" in batch:
        parts = [partial_from_logprobs(batch["part_logp"], batch["part_tid"], batch["part_sid"], student_vocab)]
    else:
        assert t_hidden is not None
        h = t_hidden[batch["t_part"]]
        parts = [partial_targets(h[i: i + spec.chunk], t_head, batch["part_tid"][i: i + spec.chunk],
                                 batch["part_sid"][i: i + spec.chunk], spec.temperature, student_vocab)
                 for i in range(0, h.shape[0], spec.chunk)]  # full teacher logits of `chunk` rows at most
    fields = list(zip(*((p.sid, p.logp, p.mapped, p.tail) for p in parts)))
    pt = merge_duplicates(TeacherTargets(*(torch.cat(f) for f in fields)), student_vocab)
    k = max(t.sid.shape[1], pt.sid.shape[1])
    a, b = _pad_k(t, k, student_vocab), _pad_k(pt, k, student_vocab)
    both = TeacherTargets(*(torch.cat([x, y]) for x, y in zip((a.sid, a.logp, a.mapped, a.tail),
                                                              (b.sid, b.logp, b.mapped, b.tail))))
    return both, torch.cat([s_pos, batch["s_part"]])


def mapped_top1(t: TeacherTargets) -> torch.Tensor:
    """[N] the student id of the teacher's most likely mapped id (V_s where none is mapped)."""
    best = t.logp.masked_fill(~t.mapped, float("-inf")).argmax(-1, keepdim=True)
    return t.sid.gather(-1, best).squeeze(-1).long()


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


def forward_losses(student: Any, teacher: Any, projs: Any, batch: dict[str, Any], spec: KDSpec, *,
                   with_kd: bool = True, with_hidden: bool = True, full_kl: bool = False) -> dict[str, torch.Tensor]:
    """One forward of student (and teacher when a term needs it). Returns sums and counts:

    lm_sum, tokens, kd_sum, hidden_sum, aligned, positions, and kl_full_sum when `full_kl` (evaluation:
    the same loss with k = the whole teacher vocabulary, reported beside the top-k value, never in place).
    A batch with `targets` (a `TeacherTargets` from the offline cache, one row per aligned pair) is
    distilled from those; the teacher then runs only for the hidden-state term or the full KL.
    """
    s_body, s_head = body_and_head(student)
    need_hidden = with_hidden and bool(spec.layer_pairs)
    need_routing = spec.router is not None and (with_kd or with_hidden)
    s_out = s_body(input_ids=batch["s_ids"], attention_mask=batch["s_mask"],
                   output_hidden_states=need_hidden or need_routing)
    hs = s_out.last_hidden_state.flatten(0, 1)
    labels = batch["labels"].flatten()
    valid = labels != -100
    s_pos, t_pos = batch["s_pos"], batch["t_pos"]
    out: dict[str, torch.Tensor] = {
        "tokens": valid.sum(), "aligned": s_pos.new_tensor(s_pos.numel()), "positions": valid.sum(),
    }
    zero = hs.new_zeros((), dtype=torch.float32)
    targets: TeacherTargets | None = batch.get("targets")
    t_out = None
    V_s = s_head.weight.shape[0]
    xtok = with_kd and spec.method != "kl"
    if (with_kd and targets is None) or need_hidden or need_routing or full_kl:
        t_body, t_head = body_and_head(teacher)
        with torch.no_grad():
            t_out = t_body(input_ids=batch["t_ids"], attention_mask=batch["t_mask"], output_hidden_states=need_hidden)
        ht = t_out.last_hidden_state.flatten(0, 1)[t_pos]
        if with_kd and spec.chain and not xtok:
            lp = next_token_logprobs(t_out.last_hidden_state, t_head, batch["t_ids"], spec.temperature, spec.chunk)
            has_span = batch["t_span"] >= 0
            chain_lp = span_logprobs(lp, t_pos, batch["t_span"])
        if xtok:
            s_al = hs[s_pos]
            kd_x, proj_x = zero, zero
            for i in range(0, s_al.shape[0], spec.chunk):  # bounded teacher logits; autograd keeps the student's
                sl = slice(i, i + spec.chunk)
                s_logits = s_head(s_al[sl])
                t_logits = t_head(ht[sl]) if spec.method != "t2s" else None
                a, b = xtok_kd(spec.method, s_logits, labels[s_pos[sl]], t_logits=t_logits, t_hidden=ht[sl],
                               t2s=spec.t2s, s_head_weight=s_head.weight, vocab_map=spec.vocab_map, k=spec.top_k,
                               temperature=spec.temperature, correct_only=spec.correct_only)
                kd_x, proj_x = kd_x + a, proj_x + b
        elif with_kd and targets is None:
            if spec.graphed is not None and ht.is_cuda:
                targets = spec.graphed(ht, clone=False)  # copied into the per-row layout below, at once
            else:
                targets = teacher_targets(ht, t_head, spec.vocab_map, spec.top_k, spec.temperature, V_s, spec.chunk)
        if full_kl:  # evaluation only: one chunk of full teacher and student logits at a time
            with torch.no_grad():
                hs_al, kl = hs[s_pos], zero
                for i in range(0, ht.shape[0], spec.chunk):
                    full = teacher_targets(ht[i: i + spec.chunk], t_head, spec.vocab_map, t_head.weight.shape[0],
                                           spec.temperature, V_s, spec.chunk)
                    full = merge_duplicates(full, V_s) if spec.merge else full
                    kl = kl + sparse_kd(s_head(hs_al[i: i + spec.chunk]), full, spec.temperature).sum()
                out["kl_full_sum"] = kl

    # LM CE and KD read each chunk's student logits once; `head_losses` keeps no logits for backward
    # (it makes them again, one matmul) and reads no value back from the device: padded rows are
    # masked, not selected, so the loop never waits for the device to learn a size.
    M = hs.shape[0]
    kd_targets = targets if with_kd and not xtok else None
    if kd_targets is not None and spec.merge:
        kd_targets = merge_duplicates(kd_targets, V_s)
    if kd_targets is not None and spec.chain:
        kd_targets = chain_targets(kd_targets, labels[s_pos], chain_lp, has_span, V_s)
    if kd_targets is not None and spec.renormalize:
        kd_targets = renormalized(kd_targets)
    s_kd = s_pos
    if kd_targets is not None and spec.partial and "s_part" in batch and ("part_logp" in batch or t_out is not None):
        kd_targets, s_kd = with_partial_rows(kd_targets, s_pos, batch,
                                             None if t_out is None else t_out.last_hidden_state.flatten(0, 1),
                                             None if t_out is None else t_head, spec, V_s)
    out["kd_rows"] = s_kd.new_tensor(s_kd.numel())
    use_kd = kd_targets is not None
    k = kd_targets.sid.shape[1] if kd_targets is not None else 1
    has_kd = torch.zeros(M, dtype=torch.bool, device=hs.device)
    sid = torch.full((M, k), V_s, dtype=torch.int32, device=hs.device)
    logp = torch.zeros((M, k), dtype=torch.float32, device=hs.device)
    mapped = torch.zeros((M, k), dtype=torch.bool, device=hs.device)
    tail = torch.full((M,), float("-inf"), dtype=torch.float32, device=hs.device)
    if kd_targets is not None:  # index_copy_, not `x[idx] = v`: the latter waited for the device on every batch (profiled)
        if spec.correct_only:  # no device sync: the keep flags are copied, not used to select
            has_kd.index_copy_(0, s_kd, mapped_top1(kd_targets) == labels[s_kd])
        else:
            has_kd.index_fill_(0, s_kd, True)
        for dst, src in ((sid, kd_targets.sid), (logp, kd_targets.logp), (mapped, kd_targets.mapped),
                         (tail, kd_targets.tail)):
            dst.index_copy_(0, s_kd, src)
    targets = kd_targets = None  # the per-row copies above are the only ones kept for the head's backward
    lm_sum, kd_sum = head_losses(hs, s_head.weight, labels, has_kd, sid, logp, mapped, tail, spec.temperature,
                                 spec.chunk, use_kd)
    out["lm_sum"], out["kd_sum"] = lm_sum, kd_sum
    if xtok:
        out["kd_sum"], out["proj_sum"] = kd_x, proj_x

    hid = zero
    if need_hidden and t_out is not None and s_pos.numel():
        for proj, (ls, lt) in zip(projs, spec.layer_pairs):
            s_h = s_out.hidden_states[ls].flatten(0, 1)[s_pos]
            t_h = t_out.hidden_states[lt].flatten(0, 1)[t_pos]
            hid = hid + hidden_loss(s_h, t_h, proj, spec.hidden_norm) / len(spec.layer_pairs)
    out["hidden_sum"] = hid
    if need_routing and t_out is not None:
        ls, lt = spec.route_layers
        s_h = s_out.hidden_states[ls].flatten(0, 1)
        logits = spec.router(s_h)
        t_logits = spec.teacher_routing.captured[lt][t_pos]
        out["routing_sum"] = routing_kl(logits[s_pos], t_logits)
        # balance over the student's real tokens: padded rows are masked out by weight, not selected
        w = valid.float()
        probs = logits.softmax(-1)
        E = logits.shape[-1]
        chosen = probs.topk(min(spec.teacher_routing.top_k, E), -1).indices
        load = torch.zeros(E, dtype=torch.float32, device=logits.device).scatter_add_(
            0, chosen.flatten(), w[:, None].expand_as(chosen).flatten())
        n = w.sum().clamp(min=1)
        share = load / (n * chosen.shape[-1])
        out["balance"] = E * (share * (probs * w[:, None]).sum(0) / n).sum()
        out["expert_load"] = load
    return out

