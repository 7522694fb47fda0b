"""Held-out evaluation with the training forward, so every number means the same thing in both.

- perplexity = exp(token-weighted mean LM cross-entropy) of the student, and nothing else (never the exp
  of a multi-part total);
- bpb = summed LM cross-entropy in bits / UTF-8 bytes of the held-out text: comparable across tokenizers
  (each window starts with bos, so every byte of the window is predicted);
- kd_topk = the training KD (same top-k, same temperature) on aligned positions; kl_full = the same loss
  with k = the whole teacher vocabulary, reported separately so a top-k/full gap is visible, not confusing;
- hidden and align_ratio as in training.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch

from trainguard.recipes.distill.data import to_device
from trainguard.recipes.distill.losses import KDSpec, forward_losses


@torch.no_grad()
def evaluate(student: Any, teacher: Any, projs: Any, batches: Iterable[dict[str, Any]], spec: KDSpec,
             amp: Callable[[], Any], device: Any, *, with_teacher: bool = True, cached_kd: bool = False
             ) -> dict[str, float]:
    """`cached_kd`: the batches carry the teacher's top-k targets from the offline cache (no teacher): kd_topk
    is reported from them, kl_full and hidden are not (a cache holds neither)."""
    was_training = student.training
    student.eval()
    projs.eval()
    sums: dict[str, float] = {}
    n_bytes = 0
    try:
        for batch in batches:
            n_bytes += batch["n_bytes"]
            with amp():
                out = forward_losses(student, teacher, projs, to_device(batch, device), spec,
                                     with_kd=with_teacher or cached_kd, with_hidden=with_teacher, full_kl=with_teacher)
            for key, value in out.items():
                if value.dim() == 0:  # sums and counts (expert loads are training's business)
                    sums[key] = sums.get(key, 0.0) + float(value)  # host sync, once per eval batch
    finally:
        student.train(was_training)
        projs.train(was_training)
    lm = sums["lm_sum"] / sums["tokens"]
    result = {
        "loss": lm,
        "perplexity": math.exp(lm),
        "bpb": sums["lm_sum"] / (math.log(2) * n_bytes),
        "tokens": sums["tokens"],
        "bytes": float(n_bytes),
        "align_ratio": sums["aligned"] / max(1.0, sums["positions"]),
    }
    if cached_kd and not with_teacher:
        result["kd_topk"] = sums["kd_sum"] / max(1.0, sums.get("kd_rows", sums["aligned"]))
    if with_teacher:
        aligned = max(1.0, sums["aligned"])
        result.update(kd_topk=sums["kd_sum"] / max(1.0, sums.get("kd_rows", aligned)), kl_full=sums["kl_full_sum"] / aligned,
                      hidden=sums["hidden_sum"] / aligned)
    return result
