"""Toy models and data for the scenario zoo: a classifier task a CPU learns in a few hundred steps.

The data are Gaussian clusters, one per class, so a healthy run's loss falls from ln(classes) towards
zero and the zoo's healthy twins have a real learning curve to stay quiet on.
"""

from __future__ import annotations

import math

import torch
from torch import nn


def clusters(n: int = 4096, dim: int = 16, classes: int = 10, seed: int = 0, spread: float = 3.0
             ) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    centres = torch.randn(classes, dim, generator=gen) * 2.0
    y = torch.randint(classes, (n,), generator=gen)
    x = centres[y] + spread * torch.randn(n, dim, generator=gen)
    return x, y


def minibatch(x: torch.Tensor, y: torch.Tensor, size: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    idx = torch.randint(len(x), (size,), generator=gen)
    return x[idx], y[idx]


class MLP(nn.Module):
    def __init__(self, dim: int = 16, hidden: int = 64, classes: int = 10) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU())
        self.head = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


class SmallCNN(nn.Module):
    """For 1x8x8 images (the clusters reshaped, dim=64)."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.conv = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(),
                                  nn.AdaptiveAvgPool2d(2))
        self.head = nn.Linear(64, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.conv(x.view(-1, 1, 8, 8)).flatten(1))


def warmup_linear(num_warmup_steps: int, num_training_steps: int):
    """The shape of Hugging Face's get_linear_schedule_with_warmup, as a LambdaLR function."""

    def lr_lambda(step: int) -> float:
        if step < num_warmup_steps:
            return (step + 1) / num_warmup_steps
        return max(0.0, (num_training_steps - step) / max(1, num_training_steps - num_warmup_steps))

    return lr_lambda


def warmup_cosine(num_warmup_steps: int, num_training_steps: int, floor: float = 0.0):
    def lr_lambda(step: int) -> float:
        if step < num_warmup_steps:
            return (step + 1) / num_warmup_steps
        progress = min(1.0, (step - num_warmup_steps) / max(1, num_training_steps - num_warmup_steps))
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))

    return lr_lambda
