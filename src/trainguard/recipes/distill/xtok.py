"""Cross-tokenizer KD losses beside the mapped top-k KL: ULD, the GOLD hybrid, and teacher-to-student projection.

All act on aligned positions only (`tokenize_align`), row by row, in plain autograd; `kd.method` in the
config picks one (`kl`, the default mapped KL of `kd.py`, is computed by `fused_head`). Definitions:

- ULD (Boizard et al. 2024, "Universal Logit Distillation"): the Wasserstein distance between the two
  next-token distributions under a uniform cost, which in closed form is the L1 distance between the
  probabilities sorted in decreasing order, the shorter vocabulary padded with zeros. No id mapping.
  With the teacher's top-k only, the first k sorted entries are compared one by one and the rest as one
  remaining mass on each side (a lower bound of the full distance; exact when k covers both vocabularies).
- GOLD hybrid (Hugging Face TRL's GOLD trainer): KL on the matched ids (teacher ids with a student
  counterpart: p_j log(p_j / q_map(j))) plus ULD's sorted L1 between the unmatched rest of each side
  (teacher top-k ids with no counterpart; student ids that no teacher id maps to), weights 1 and 1.
- T2S projection (DSKD, Zhang et al. 2024: projections through the other model's head): the teacher's
  hidden state at the aligned position, projected into the student's hidden space by a learned linear
  map and read out by the student's own head (detached), gives a teacher distribution over the
  student's vocabulary with no id mapping at all. The projection learns from the student's labels (CE,
  its own term); the student learns KL(p_t2s || q_s), the target detached.

`correct_only` (DSKD's "KD only where the projected teacher is right") keeps a row only where the
teacher side's top-1, as a student id, is the student's next token.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

METHODS = ("kl", "uld", "gold", "t2s")


def _pad_to(x: torch.Tensor, width: int) -> torch.Tensor:
    return F.pad(x, (0, width - x.shape[-1])) if x.shape[-1] < width else x


def sorted_l1(p: torch.Tensor, q: torch.Tensor, k: int) -> torch.Tensor:
    """Per-row L1 between the k largest entries of p and of q, sorted, plus the gap of the remaining masses.

    p, q [N, *] non-negative (widths may differ). With k >= both widths this is ULD's closed form exactly.
    """
    kp, kq = min(k, p.shape[-1]), min(k, q.shape[-1])
    width = max(kp, kq)
    ps = _pad_to(p.topk(kp, dim=-1).values, width)
    qs = _pad_to(q.topk(kq, dim=-1).values, width)
    rest = (p.sum(-1) - ps.sum(-1)) - (q.sum(-1) - qs.sum(-1))
    return (ps - qs).abs().sum(-1) + rest.abs()


def uld_rows(t_logits: torch.Tensor, s_logits: torch.Tensor, k: int, temperature: float) -> torch.Tensor:
    """ULD per row [N]: teacher logits [N, V_t] (no grad), student logits [N, V_s]."""
    p = (t_logits.float() / temperature).softmax(-1)
    q = (s_logits.float() / temperature).softmax(-1)
    return sorted_l1(p, q, k)


def gold_rows(t_logits: torch.Tensor, s_logits: torch.Tensor, vocab_map: torch.Tensor, k: int,
              temperature: float) -> torch.Tensor:
    """GOLD's hybrid per row [N]: KL over the teacher's matched top-k ids + sorted L1 over both unmatched rests."""
    t_logp = (t_logits.float() / temperature).log_softmax(-1)
    s_logp = (s_logits.float() / temperature).log_softmax(-1)
    top, idx = t_logp.topk(min(k, t_logp.shape[-1]), dim=-1)
    sid = vocab_map[idx]
    matched = sid >= 0
    q = s_logp.gather(-1, sid.clamp(min=0))
    p = torch.where(matched, top.exp(), 0.0)
    kl = (p * torch.where(matched, top - q, 0.0)).sum(-1)
    s_matched = torch.zeros(s_logp.shape[-1], dtype=torch.bool, device=s_logp.device)
    s_matched[vocab_map[vocab_map >= 0]] = True
    t_un = torch.where(matched, 0.0, top.exp())  # the teacher's unmatched mass inside its top-k
    s_un = s_logp.exp().masked_fill(s_matched, 0.0)
    kp = min(k, t_un.shape[-1])
    ps = t_un.topk(kp, dim=-1).values
    width = max(kp, min(k, s_un.shape[-1]))
    qs = _pad_to(s_un.topk(min(k, s_un.shape[-1]), dim=-1).values, width)
    return kl + (_pad_to(ps, width) - qs).abs().sum(-1)


def kl_rows(target_logits: torch.Tensor, s_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """KL(softmax(target / T) || softmax(student / T)) * T^2 per row, the target detached."""
    p_log = (target_logits.detach().float() / temperature).log_softmax(-1)
    q_log = (s_logits.float() / temperature).log_softmax(-1)
    return (p_log.exp() * (p_log - q_log)).sum(-1) * temperature**2


class TeacherToStudent(torch.nn.Module):
    """Teacher hidden [*, H_t] -> student hidden space [*, H_s]; read out by the student's head (detached)."""

    def __init__(self, teacher_hidden: int, student_hidden: int):
        super().__init__()
        self.proj = torch.nn.Linear(teacher_hidden, student_hidden, bias=False)
        # small init: the projected teacher starts near uniform, so its first targets cannot be loud and wrong
        torch.nn.init.normal_(self.proj.weight, std=0.02 / teacher_hidden**0.5)

    def forward(self, teacher_h: torch.Tensor, student_head_weight: torch.Tensor) -> torch.Tensor:
        return F.linear(self.proj(teacher_h.detach().float()), student_head_weight.detach().float())


def xtok_kd(method: str, s_logits: torch.Tensor, labels: torch.Tensor, *, t_logits: torch.Tensor | None = None,
            t_hidden: torch.Tensor | None = None, t2s: Any = None, s_head_weight: torch.Tensor | None = None,
            vocab_map: torch.Tensor | None = None, k: int = 64, temperature: float = 1.0,
            correct_only: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of the KD rows, sum of the T2S projection's CE) over aligned rows [N].

    s_logits [N, V_s] student logits at the aligned positions, labels [N] the student's next tokens.
    """
    zero = s_logits.new_zeros((), dtype=torch.float32)
    if s_logits.shape[0] == 0:
        return zero, zero
    proj_ce = zero
    if method == "t2s":
        assert t2s is not None and t_hidden is not None and s_head_weight is not None
        z = t2s(t_hidden, s_head_weight)
        proj_ce = F.cross_entropy(z, labels, reduction="sum")
        rows = kl_rows(z, s_logits, temperature)
        top1 = z.argmax(-1)
    else:
        assert t_logits is not None and vocab_map is not None
        if method == "uld":
            rows = uld_rows(t_logits, s_logits, k, temperature)
        elif method == "gold":
            rows = gold_rows(t_logits, s_logits, vocab_map, k, temperature)
        else:
            raise ValueError(f"unknown cross-tokenizer KD method {method!r}")
        t_logp = t_logits.float().masked_fill(vocab_map < 0, float("-inf"))
        top1 = vocab_map[t_logp.argmax(-1)]
    if correct_only:
        rows = torch.where(top1 == labels, rows, 0.0)
    return rows.sum(), proj_ce
