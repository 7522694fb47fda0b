"""A tiny mixture-of-experts classifier (top-1 routing, Switch-style balance loss) for the zoo."""

from __future__ import annotations

import torch
from torch import nn


class TinyMoE(nn.Module):
    def __init__(self, dim: int = 16, hidden: int = 32, experts: int = 8, classes: int = 10) -> None:
        super().__init__()
        self.inp = nn.Linear(dim, hidden)
        self.router = nn.Linear(hidden, experts)
        self.experts = nn.ModuleList(nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU()) for _ in range(experts))
        self.head = nn.Linear(hidden, classes)
        self.load = torch.zeros(experts)
        self.balance = torch.zeros(())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.inp(x))
        probs = torch.softmax(self.router(h), -1)
        choice = probs.argmax(-1)
        out = torch.zeros_like(h)
        for i, expert in enumerate(self.experts):
            mask = choice == i
            if mask.any():
                out[mask] = expert(h[mask]) * probs[mask, i : i + 1]
        n = len(self.experts)
        self.load = torch.bincount(choice, minlength=n).float()
        # Switch Transformer's auxiliary loss: n * sum(fraction routed x mean router probability)
        self.balance = n * (self.load / len(x) * probs.mean(0)).sum()
        return self.head(h + out)
