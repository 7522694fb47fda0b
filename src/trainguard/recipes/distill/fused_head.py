"""The student's output head, LM cross-entropy and sparse KD in one pass per chunk of positions.

`head_losses(h, weight, ...)` returns (sum of LM CE, sum of KD) like `F.cross_entropy` + `kd.sparse_kd`
on `h @ weight.T` would, with the gradients written by hand so that autograd keeps nothing per chunk:

- forward: per chunk of `chunk` rows, the logits [c, V_s] are made once, both losses read them, and only
  three numbers per row survive (log-sum-exp at T = 1 and at T, and the student's tail log-mass);
- backward: each chunk's logits are made again (one matmul: cheaper than keeping them) and the
  gradient with respect to them is written in closed form, then pushed through the head's matmuls.

Closed forms, with x = z / T, s = softmax(x), S the mapped student ids of a row, p their teacher
probabilities, p_t the teacher tail, q_t = sum of s outside S, and M = sum(p) + p_t (1 up to rounding):

    d CE / d z_j = softmax(z)_j - [j = label]
    d KD / d z_j = T * ( s_j * (M - [j not in S] * p_t / q_t) - [j in S] * p_j )

The student's softmax is materialised once per chunk (twice in backward only when T != 1, for the
T = 1 one of the LM term), never as an autograd graph over [N, V_s] tensors.
"""

from __future__ import annotations

from typing import Any

import torch

from trainguard.recipes.distill.kd import MASKED


def _compute_dtype(weight: torch.Tensor) -> torch.dtype:
    dev = weight.device.type
    if torch.is_autocast_enabled(dev):
        return torch.get_autocast_dtype(dev)
    return weight.dtype


class _HeadLosses(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, h: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, has_kd: torch.Tensor,
                sid: torch.Tensor, logp: torch.Tensor, mapped: torch.Tensor, tail: torch.Tensor,
                temperature: float, chunk: int, with_kd: bool) -> tuple[torch.Tensor, torch.Tensor]:
        cd = _compute_dtype(weight)
        w = weight.to(cd)
        T = temperature
        ce_sum = torch.zeros((), dtype=torch.float32, device=h.device)
        kd_sum = torch.zeros((), dtype=torch.float32, device=h.device)
        lse1s, lsets, lqts = [], [], []
        for lo in range(0, h.shape[0], chunk):
            sl = slice(lo, lo + chunk)
            z = (h[sl].to(cd) @ w.T).float()
            valid = labels[sl] != -100
            lse1 = torch.logsumexp(z, dim=-1)
            picked = z.gather(-1, labels[sl].clamp(min=0)[:, None]).squeeze(-1)
            ce_sum = ce_sum + torch.where(valid, lse1 - picked, 0.0).sum()
            lse1s.append(lse1)
            if not with_kd:
                continue
            x = z / T if T != 1.0 else z
            lset = torch.logsumexp(x, dim=-1) if T != 1.0 else lse1
            keep = _outside(sid[sl], z.shape[-1])
            lqt = torch.logsumexp(torch.where(keep, x, MASKED), dim=-1) - lset  # student tail, exactly
            m = mapped[sl]
            q = torch.where(m, x.gather(-1, torch.where(m, sid[sl], 0).long()) - lset[:, None], 0.0)
            p = torch.where(m, logp[sl].exp(), 0.0)
            body = (p * (logp[sl] - q)).sum(-1)
            t = tail[sl]
            has_tail = torch.isfinite(t)
            p_t = torch.where(has_tail, t.exp(), 0.0)
            rows = (body + p_t * (torch.where(has_tail, t, 0.0) - lqt)) * T**2
            kd_sum = kd_sum + torch.where(has_kd[sl], rows, 0.0).sum()
            lsets.append(lset)
            lqts.append(lqt)
        ctx.save_for_backward(h, weight, labels, has_kd, sid, logp, mapped, tail, torch.cat(lse1s),
                              torch.cat(lsets) if lsets else lse1s[0].new_zeros(0),
                              torch.cat(lqts) if lqts else lse1s[0].new_zeros(0))
        ctx.settings = (T, chunk, with_kd, cd)
        return ce_sum, kd_sum

    @staticmethod
    def backward(ctx: Any, g_ce: torch.Tensor, g_kd: torch.Tensor) -> tuple[Any, ...]:
        h, weight, labels, has_kd, sid, logp, mapped, tail, lse1_all, lset_all, lqt_all = ctx.saved_tensors
        T, chunk, with_kd, cd = ctx.settings
        w = weight.to(cd)
        dh = torch.empty_like(h)
        dw = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        for lo in range(0, h.shape[0], chunk):
            sl = slice(lo, lo + chunk)
            hc = h[sl].to(cd)
            z = (hc @ w.T).float()
            valid = labels[sl] != -100
            a = torch.where(valid, g_ce, 0.0)
            g = torch.exp(z - lse1_all[sl, None]) * a[:, None]
            g.scatter_add_(-1, labels[sl].clamp(min=0)[:, None], -a[:, None])
            if with_kd:
                x = z / T if T != 1.0 else z
                s = torch.exp(x - lset_all[sl, None])
                m = mapped[sl]
                p = torch.where(m, logp[sl].exp(), 0.0)
                t = tail[sl]
                p_t = torch.where(torch.isfinite(t), t.exp(), 0.0)
                total = p.sum(-1) + p_t
                ratio = p_t / lqt_all[sl].exp().clamp(min=1e-30)
                coef = torch.where(has_kd[sl], g_kd * T, 0.0)
                keep = _outside(sid[sl], z.shape[-1])
                g += s * (coef[:, None] * (total[:, None] - keep * ratio[:, None]))
                g.scatter_add_(-1, torch.where(m, sid[sl], 0).long(), (-coef[:, None] * p).to(g.dtype))
            gc = g.to(cd)
            dh[sl] = (gc @ w).to(h.dtype)
            dw += (gc.T @ hc).float()
        return dh, dw.to(weight.dtype), None, None, None, None, None, None, None, None, None


def _outside(sid: torch.Tensor, width: int) -> torch.Tensor:
    """[c, width] bool: True where a column is not among the row's mapped ids (unmapped ids point at width)."""
    keep = torch.ones((sid.shape[0], width + 1), dtype=torch.bool, device=sid.device)
    keep.scatter_(-1, sid.long(), False)
    return keep[:, :width]


def head_losses(h: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, has_kd: torch.Tensor,
                sid: torch.Tensor, logp: torch.Tensor, mapped: torch.Tensor, tail: torch.Tensor,
                temperature: float, chunk: int, with_kd: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of LM CE over rows with a label, sum of KD over rows with `has_kd`), rows of h [M, H].

    labels [M] (-100: none); per-row KD targets as `kd.TeacherTargets` fields laid out over all M rows.
    """
    return _HeadLosses.apply(h, weight, labels, has_kd, sid, logp, mapped, tail, float(temperature), int(chunk),
                             bool(with_kd))
