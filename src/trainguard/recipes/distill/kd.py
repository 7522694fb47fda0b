"""Sparse top-k knowledge distillation across vocabularies: the teacher's side, streamed.

Teacher side (no grad): for each aligned position, the top-k of the tempered log-probs
log softmax(z_t / T) are kept, their ids mapped to student ids (`vocab_map`), and everything else
(the rest of the vocabulary and top-k ids with no student counterpart) becomes one tail term.

The teacher's logits are never held whole, not even for one chunk of positions: `teacher_targets`
walks `rows` positions x `tile` vocabulary columns at a time, keeping a running log-sum-exp and a
running top-k (each tile's top-k merged with the best so far). At B=4, T=512, V_t=151,936 the full fp32
logits are 1,187 MiB; the working set here is one tile (rows x tile x 6 bytes: the bf16 product and
its fp32 copy) plus the [N, k] result. The tail is 1 - (mass of the mapped top-k), in fp32: its
rounding (~1e-7 absolute) only matters where the tail itself is negligible.

On CUDA the whole walk is captured once per padded row count as a CUDA graph (`GraphedTargets`): a
walk is a few hundred small kernels, and replaying them costs one launch instead of a few thousand.

Student side: `fused_head.head_losses` (one pass over each chunk of student logits for LM and KD).
`sparse_kd` below is the plain autograd form of the same KD, kept as the reference the fused one is
tested against and for evaluation's full-vocabulary KL:

    KD = T^2 * ( sum_i p_i (log p_i - log q_i) + p_tail (log p_tail - log q_tail) )

It is a true KL (>= 0). With the same tokenizer and k = vocabulary size every id maps, the tail is
empty, and it equals the full-vocabulary KL(p_T || q_T) * T^2 (tested).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

MASKED = -1.0e4  # finite "minus infinity" for masked logits: logsumexp stays finite, gradients stay NaN-free
TILE_ELEMENTS = 1 << 19  # rows x vocabulary columns of teacher logits alive at once (3 MiB as bf16 + fp32)
KERNEL_ROWS = 256  # rows per Triton walk: a [256, 3840] bf16 tile is 1.9 MiB


@dataclass
class TeacherTargets:
    sid: torch.Tensor  # [N, k] int32 student ids; V_s (one past the student vocabulary) where unmapped
    logp: torch.Tensor  # [N, k] float32 tempered teacher log-probs; 0 where unmapped (masked by `mapped`)
    mapped: torch.Tensor  # [N, k] bool
    tail: torch.Tensor  # [N] float32 log of the teacher mass outside the mapped top-k (-inf when none)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.sid, self.logp, self.mapped, self.tail))


def _logit_tile(head: Any, h: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    """Columns lo:hi of head(h), computed from those rows of the weight only (any callable: sliced)."""
    weight = getattr(head, "weight", None)
    if weight is None:
        return head(h)[:, lo:hi]
    bias = getattr(head, "bias", None)
    return F.linear(h.to(weight.dtype), weight[lo:hi], None if bias is None else bias[lo:hi])


def _head_width(head: Any, h: torch.Tensor) -> int:
    weight = getattr(head, "weight", None)
    return int(weight.shape[0]) if weight is not None else int(head(h[:1]).shape[-1])


def _finish(top: torch.Tensor, idx: torch.Tensor, lse: torch.Tensor, vocab_map: torch.Tensor,
            student_vocab: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    sid = vocab_map[idx]
    mapped = sid >= 0
    logp = torch.where(mapped, top - lse[:, None], 0.0)
    inside = torch.where(mapped, logp.exp(), 0.0).sum(-1)
    tail = torch.log1p(-inside.clamp(max=1.0))  # -inf when the mapped top-k holds all the mass
    return torch.where(mapped, sid, student_vocab).to(torch.int32), logp, mapped, tail


def _exact_rows(h: torch.Tensor, head: Any, vocab_map: torch.Tensor, temperature: float,
                student_vocab: int) -> tuple[torch.Tensor, ...]:
    """k = the whole vocabulary (evaluation's full KL): no selection, the tail computed exactly."""
    z = head(h).float() / temperature
    lse = torch.logsumexp(z, dim=-1, keepdim=True)
    sid = vocab_map.expand_as(z)
    mapped = sid >= 0
    tail = (torch.logsumexp(z.masked_fill(mapped, float("-inf")), dim=-1, keepdim=True) - lse).squeeze(-1)
    return (torch.where(mapped, sid, student_vocab).to(torch.int32), torch.where(mapped, z - lse, 0.0), mapped,
            tail)


def _streamed_rows(h: torch.Tensor, head: Any, vocab_map: torch.Tensor, k: int, temperature: float,
                   student_vocab: int, width: int, tile: int) -> tuple[torch.Tensor, ...]:
    """Running log-sum-exp and top-k over vocabulary tiles of `h`'s logits (plain torch)."""
    lse = torch.full((h.shape[0],), float("-inf"), device=h.device)
    top: torch.Tensor | None = None
    idx: torch.Tensor | None = None
    for lo in range(0, width, tile):
        z = _logit_tile(head, h, lo, min(width, lo + tile)).float() / temperature
        lse = torch.logaddexp(lse, torch.logsumexp(z, dim=-1))
        v, i = z.topk(min(k, z.shape[-1]), dim=-1, sorted=False)
        if top is None or idx is None:
            top, idx = v, i + lo
        else:
            v, i = torch.cat([top, v], -1), torch.cat([idx, i + lo], -1)
            top, pos = v.topk(min(k, v.shape[-1]), dim=-1, sorted=False)
            idx = i.gather(-1, pos)
    assert top is not None and idx is not None  # width > 0: at least one tile
    return _finish(top, idx, lse, vocab_map, student_vocab)


def _kernel_rows(h: torch.Tensor, head: Any, vocab_map: torch.Tensor, k: int, temperature: float,
                 student_vocab: int, width: int) -> tuple[torch.Tensor, ...]:
    """The same walk with `topk_triton.merge_tile`: 16-bit logits tiles, no sort, one kernel per tile."""
    from trainguard.recipes.distill import topk_triton

    r = h.shape[0]
    tile = topk_triton.BLOCK - k
    weight = head.weight
    run_val = torch.empty((r, k), dtype=weight.dtype, device=h.device)
    run_id = torch.empty((r, k), dtype=torch.int32, device=h.device)
    m = torch.full((r,), float("-inf"), device=h.device)
    s = torch.zeros((r,), device=h.device)
    for lo in range(0, width, tile):
        z = _logit_tile(head, h, lo, min(width, lo + tile))
        topk_triton.merge_tile(z, lo, run_val, run_id, m, s, 1.0 / temperature, k, first=lo == 0)
    return _finish(run_val.float() / temperature, run_id.long(), m + s.log(), vocab_map, student_vocab)


def _use_kernel(hidden: torch.Tensor, head: Any, k: int, width: int) -> bool:
    weight = getattr(head, "weight", None)
    if not (hidden.is_cuda and weight is not None and weight.dtype in (torch.bfloat16, torch.float16)):
        return False
    if getattr(head, "bias", None) is not None or not 1 <= k <= 1024 or width <= 2 * k:
        return False
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


@torch.no_grad()
def teacher_targets(hidden: torch.Tensor, head: Any, vocab_map: torch.Tensor, k: int, temperature: float,
                    student_vocab: int, chunk: int, tile: int | None = None, kernel: bool | None = None) -> TeacherTargets:
    """Top-k tempered teacher log-probs at `hidden` [N, H_t], mapped into student ids.

    `chunk` positions at a time, and `tile` vocabulary columns at a time (default: `TILE_ELEMENTS` //
    chunk, at least 2k), so at most chunk x tile teacher logits exist at once. On CUDA with a 16-bit
    head the walk uses the Triton kernel (`kernel=None`: when available), `KERNEL_ROWS` rows at a time.
    The result is written into tensors allocated once, so the targets are never held twice.
    """
    width = _head_width(head, hidden)
    n = hidden.shape[0]
    kk = min(k, width)
    out = TeacherTargets(torch.empty((n, kk), dtype=torch.int32, device=hidden.device),
                         torch.empty((n, kk), dtype=torch.float32, device=hidden.device),
                         torch.empty((n, kk), dtype=torch.bool, device=hidden.device),
                         torch.empty((n,), dtype=torch.float32, device=hidden.device))
    use_kernel = k < width and (_use_kernel(hidden, head, k, width) if kernel is None else kernel)
    step = KERNEL_ROWS if use_kernel else chunk
    for i in range(0, n, step):
        h = hidden[i: i + step]
        if k >= width:
            part = _exact_rows(h, head, vocab_map, temperature, student_vocab)
        elif use_kernel:
            part = _kernel_rows(h, head, vocab_map, k, temperature, student_vocab, width)
        else:
            t = tile or max(2 * k, TILE_ELEMENTS // max(1, h.shape[0]))
            part = _streamed_rows(h, head, vocab_map, k, temperature, student_vocab, width, t)
        for dst, src in zip((out.sid, out.logp, out.mapped, out.tail), part):
            dst[i: i + h.shape[0]] = src
    return out


class GraphedTargets:
    """`teacher_targets` replayed as CUDA graphs, one per padded row count (a multiple of `chunk`).

    The head, the vocabulary map and the settings are fixed for the object's life (a frozen teacher).
    Positions are copied into a static input, padding rows are zeros (their targets are dropped), and
    the outputs are cloned, so nothing a caller holds is overwritten by the next replay.
    """

    def __init__(self, head: Any, vocab_map: torch.Tensor, k: int, temperature: float, student_vocab: int,
                 chunk: int, tile: int | None = None, max_graphs: int = 8):
        self.args = (head, vocab_map, k, temperature, student_vocab, chunk, tile)
        self.chunk, self.max_graphs = chunk, max_graphs
        self.graphs: dict[int, tuple[Any, torch.Tensor, TeacherTargets]] = {}

    def _capture(self, rows: int, like: torch.Tensor) -> tuple[Any, torch.Tensor, TeacherTargets]:
        head, vmap, k, temperature, sv, chunk, tile = self.args
        static = torch.zeros((rows, like.shape[1]), dtype=like.dtype, device=like.device)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up outside capture (lazy inits, cuBLAS workspaces)
            teacher_targets(static, head, vmap, k, temperature, sv, chunk, tile)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # thread_local: only this thread's calls are checked during capture. In torch's default (global)
        # mode a call another thread makes meanwhile (the guard's memory sample, an event query) voids
        # the capture: a kd_online student on the H200 failed at its first step that way
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            out = teacher_targets(static, head, vmap, k, temperature, sv, chunk, tile)
        return graph, static, out

    def __call__(self, hidden: torch.Tensor, clone: bool = True) -> TeacherTargets:
        """Targets of `hidden`'s rows. With clone=False they are views of the graph's own outputs, valid
        until the next call: for a caller that copies them at once (one copy of the signal, not two)."""
        n = hidden.shape[0]
        rows = max(self.chunk, -(-n // self.chunk) * self.chunk)
        entry = self.graphs.get(rows)
        if entry is None:
            if len(self.graphs) >= self.max_graphs:
                self.graphs.pop(next(iter(self.graphs)))
            entry = self.graphs[rows] = self._capture(rows, hidden)
        graph, static, out = entry
        static[:n].copy_(hidden)
        static[n:].zero_()
        graph.replay()
        views = TeacherTargets(out.sid[:n], out.logp[:n], out.mapped[:n], out.tail[:n])
        return TeacherTargets(*(x.clone() for x in (views.sid, views.logp, views.mapped, views.tail))) if clone else views


def sparse_kd(student_logits: torch.Tensor, t: TeacherTargets, temperature: float) -> torch.Tensor:
    """Per-position KD [n] between teacher targets and student logits [n, V_s] (same rows)."""
    z = student_logits.float() / temperature
    lse = torch.logsumexp(z, dim=-1, keepdim=True)
    ext = torch.cat([z, z.new_full((z.shape[0], 1), MASKED)], dim=-1)  # column V_s: where unmapped ids point
    sid = t.sid.long()
    q = ext.gather(-1, sid) - lse
    tail_s = torch.logsumexp(ext.scatter(-1, sid, MASKED), dim=-1) - lse.squeeze(-1)
    p = torch.where(t.mapped, t.logp.exp(), 0.0)
    body = (p * (t.logp - q)).sum(-1)
    has_tail = torch.isfinite(t.tail)
    p_tail = torch.where(has_tail, t.tail.exp(), 0.0)
    tail = p_tail * (torch.where(has_tail, t.tail, 0.0) - tail_s)
    return (body + tail) * temperature**2
