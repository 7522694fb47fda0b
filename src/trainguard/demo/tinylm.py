"""A tiny character-level transformer LM and its data, small enough for a CPU step of tens of milliseconds.

Shared by the demo (`trainguard demo`), the overhead benchmark and the scenario zoo, so all three train
the same realistic thing.
"""

from __future__ import annotations

import math

import torch
from torch import nn

TEXT = (
    "the quick brown fox jumps over the lazy dog. a watched run never hangs for long; "
    "a learning rate that sits at zero is found in seconds; a loss that turns to nan is named at its step. "
)


def corpus(repeat: int = 200) -> torch.Tensor:
    data = (TEXT * repeat).encode()
    return torch.tensor(list(data), dtype=torch.long)


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class TinyLM(nn.Module):
    mask: torch.Tensor  # a buffer (register_buffer below): the causal mask

    def __init__(self, vocab: int = 256, dim: int = 128, layers: int = 2, heads: int = 4, ctx: int = 64) -> None:
        super().__init__()
        self.ctx = ctx
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(ctx, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)
        self.register_buffer("mask", torch.triu(torch.full((ctx, ctx), float("-inf")), diagonal=1), persistent=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = block(x, self.mask[:t, :t])
        return self.head(self.ln(x))


def batch(data: torch.Tensor, batch_size: int, ctx: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    ix = torch.randint(len(data) - ctx - 1, (batch_size,), generator=gen)
    x = torch.stack([data[i : i + ctx] for i in ix])
    y = torch.stack([data[i + 1 : i + ctx + 1] for i in ix])
    return x, y


def cosine_with_warmup(optimizer: torch.optim.Optimizer, warmup: int, total: int) -> torch.optim.lr_scheduler.LambdaLR:
    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
