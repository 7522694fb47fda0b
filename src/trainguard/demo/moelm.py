"""A tiny mixture-of-experts language model and the loss terms MoE LMs are trained with, for the zoo.

One attention block whose MLP is a top-2 router over 4 experts. `loss_parts` returns the LM loss and the
three usual regularisers, raw; `WEIGHTS` holds their conventional coefficients: the router's
load-balancing loss at 0.01 (E x sum f_e P_e, 1 when even: OLMoE's router_aux_loss_coef, Megatron's
suggested moe_aux_loss_coeff), the router z-loss at 1e-3 (ST-MoE) and PaLM's z-loss on the output
logits at 1e-4. A CPU step takes a few milliseconds.
"""

from __future__ import annotations

import torch
from torch import nn

WEIGHTS = {"lm": 1.0, "balance": 0.01, "router_z": 1e-3, "z": 1e-4}


class MoE(nn.Module):
    """Top-k of `experts` MLPs; keeps the step's routing statistics for the loss terms and `guard.experts`."""

    def __init__(self, dim: int, experts: int = 4, top_k: int = 2) -> None:
        super().__init__()
        self.top_k = top_k
        self.router = nn.Linear(dim, experts, bias=False)
        self.experts = nn.ModuleList(nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))
                                     for _ in range(experts))
        self.load = torch.zeros(experts)
        self.balance = self.router_z = torch.zeros(())

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        logits = self.router(h)  # [B, T, E]
        probs = logits.softmax(-1)
        top_p, top_i = probs.topk(self.top_k, -1)
        gates = torch.zeros_like(probs).scatter(-1, top_i, top_p / top_p.sum(-1, keepdim=True))
        out = sum(gates[..., e : e + 1] * expert(h) for e, expert in enumerate(self.experts))
        chosen = torch.zeros_like(probs).scatter(-1, top_i, 1.0).flatten(0, 1)
        self.load = chosen.sum(0).detach()  # top-k assignments per expert
        share = chosen.mean(0) / self.top_k  # f_e, the expert's share of the assignments
        self.balance = len(self.experts) * (share * probs.flatten(0, 1).mean(0)).sum()
        self.router_z = logits.logsumexp(-1).pow(2).mean()
        return out


class MoELM(nn.Module):
    mask: torch.Tensor  # a buffer (register_buffer below): the causal mask

    def __init__(self, vocab: int = 256, dim: int = 32, heads: int = 4, ctx: int = 32) -> None:
        super().__init__()
        self.ctx = ctx
        self.tok, self.pos = nn.Embedding(vocab, dim), nn.Embedding(ctx, dim)
        self.ln1, self.ln2, self.ln = nn.LayerNorm(dim), nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.moe = MoE(dim)
        self.head = nn.Linear(dim, vocab)
        self.register_buffer("mask", torch.triu(torch.full((ctx, ctx), float("-inf")), diagonal=1), persistent=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=self.mask[:t, :t], need_weights=False)[0]
        x = x + self.moe(self.ln2(x))
        return self.head(self.ln(x))


def loss_parts(model: MoELM, logits: torch.Tensor, targets: torch.Tensor, reduction: str = "mean") -> dict[str, torch.Tensor]:
    """The LM loss and the three regularisers of the forward that made `logits`, raw (unweighted)."""
    lm = nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction=reduction)
    z = logits.logsumexp(-1).pow(2).mean()  # PaLM: (log Z)^2 of the output softmax
    return {"lm": lm, "balance": model.moe.balance, "router_z": model.moe.router_z, "z": z}
