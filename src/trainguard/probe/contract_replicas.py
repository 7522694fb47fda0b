"""DDP replicas drifting apart (replicas-diverged): a checksum of a few parameter tensors per sampled step.

Only where replicas must be identical (a DistributedDataParallel model: the context's `world`). Each rank
sums a strided sample of the same few tensors after a sampled optimizer step and writes its sums as a
"param-checksum" event; the rule (rules/contracts.py) compares the ranks, since a process sees only itself.
"""

from __future__ import annotations

from typing import Any

from trainguard.contract import EVENT_CONTRACT
from trainguard.probe.contract_context import CheckContext, Launched
from trainguard.rules.contracts_data import ReplicasDiverged

CHECKSUM_TENSORS = 8  # parameter tensors in the DDP checksum
CHECKSUM_ELEMENTS = 1 << 16  # elements per tensor at most (strided sample)
PARAM_CHECKSUM = "param-checksum"  # one rank's sums on one sampled step (compared by the rule)


class ReplicaChecks:
    """A parameter checksum per sampled step and rank, for a replicated model."""

    def __init__(self, ctx: CheckContext) -> None:
        self.ctx = ctx
        self.params: list[tuple[str, Any]] = []  # (name, parameter) summed, chosen at a sampled scan

    def choose(self, step: int, params: list[tuple[int, Any]]) -> None:
        """The tensors to sum, chosen once from the optimizer's parameters as scanned at a sampled step:
        the first and the largest."""
        ctx = self.ctx
        if ctx.world > 1 and ReplicasDiverged.name not in ctx.off and not self.params and ctx.sampled(step):
            by_size = sorted(((ctx.name(p), p) for _, p in params), key=lambda np_: -np_[1].numel())
            self.params = list({id(p): (n, p) for n, p in
                                [(ctx.name(params[0][1]), params[0][1]), *by_size[:CHECKSUM_TENSORS - 1]]
                                }.values())

    def checksum(self, step: int) -> None:
        """After a sampled optimizer step: this rank's sums, copied to the host without a sync."""
        import torch

        if not self.params:
            return
        dist = torch.distributed
        if not (dist.is_available() and dist.is_initialized()):
            return
        with torch.no_grad():
            sums = torch.stack([p.detach().reshape(-1)[::max(1, p.numel() // CHECKSUM_ELEMENTS)].double().sum()
                                for _, p in self.params])
        names = [n for n, _ in self.params]
        rank = dist.get_rank()
        ctx = self.ctx

        def then(values: list[float], item: Launched) -> None:
            # one event per sampled step and rank: the rule compares ranks (this process sees only itself)
            ctx.guard.writer.add_event(EVENT_CONTRACT, PARAM_CHECKSUM, {
                "rank": rank, "names": names, "sums": values}, step=item.step)

        ctx.launch(step, sums, then)
