"""What an optimizer step updates: nothing at all (step-updates-nothing), parameters the user froze
(frozen-params-updated), and whether the step runs under torch.compile (which names the cause of a
compiled step that replays a no-op).

The optimizer's parameters are scanned whole (`requires_grad`, `.grad`: ~0.4 us a tensor) on the first
`SCAN_WARMUP` steps, every `stats_every` steps, and on any step where one of a few evenly spaced sentinel
parameters changed `requires_grad` or has no gradient; otherwise the sentinels alone are read. Device
work only when the scan finds a frozen parameter with a gradient: a strided sample of it is compared
around the step, and the result copied to the host without a sync.
"""

from __future__ import annotations

import itertools
import operator
import os
import sys
from typing import Any

from trainguard.probe.contract_context import MAX_NAMES, CheckContext, Launched
from trainguard.rules.contracts import FrozenParamsUpdated, StepUpdatesNothing

FROZEN_TENSORS = 16  # frozen tensors compared around a sampled optimizer step
SCAN_WARMUP = 10  # optimizer steps whose parameters are all scanned before the scan thins out
SENTINELS = 8  # evenly spaced parameters read every step (plus the first, last and largest)
STEP_COMPILED = "optimizer-step-compiled"  # the event that names a compiled optimizer step (no rule of its own)

_requires_grad = operator.attrgetter("requires_grad")
_grad = operator.attrgetter("grad")


class ParamChecks:
    """The optimizer's parameters, read around its step: what it updates and whether it runs compiled."""

    def __init__(self, ctx: CheckContext) -> None:
        self.ctx = ctx
        self.no_grad_steps: list[int] = []
        self.frozen_before: list[tuple[str, Any, Any, int]] = []
        self.step_compiled = False  # optimizer.step seen running under torch.compile
        self.opt_key: list[tuple[Any, int]] | None = None  # each group's params list and its length, as scanned
        self.opt_params: list[tuple[int, Any]] = []  # (group index, parameter) of the optimizer
        self.opt_flat: list[Any] = []  # the same parameters alone
        self.sentinels: list[Any] = []
        self.sentinel_trainable: list[bool] = []  # their requires_grad at the last whole scan
        self.rescan = False  # the last whole scan found frozen parameters with gradients: scan the next step too

    def look_for_compile(self, optimizer: Any, step: int) -> None:
        """A compiled step that replays a no-op (pytorch/pytorch#115607) looks like any step that changes
        nothing: knowing it runs under torch.compile names the cause. A few frames up, on the first steps
        and every tenth sample until found (a loop compiles its step from the start). Called from the
        dispatcher's `opt_pre`, itself called from the guard's hook."""
        try:
            self.step_compiled = _under_compile(sys._getframe(3))  # above the guard's hook
            if self.step_compiled:
                self.ctx.report(STEP_COMPILED, {"optimizer": type(optimizer).__name__}, step=step)
        except Exception as exc:
            self.ctx.failed(STEP_COMPILED, exc)

    def params_of(self, optimizer: Any, again: bool = False) -> list[tuple[int, Any]]:
        """The optimizer's parameters, flattened again only when its groups change (a group added, a list
        replaced or resized) or `again` (a whole scan found them changed in place, or a freeze)."""
        groups = optimizer.param_groups
        key = self.opt_key
        if not again and key is not None and len(key) == len(groups):
            if len(key) == 1:  # one group, the usual case: asked without a loop
                lst, n = key[0]
                params = groups[0]["params"]
                if params is lst and len(params) == n:
                    return self.opt_params
            for (lst, n), group in zip(key, groups):
                params = group["params"]
                if params is not lst or len(params) != n:
                    break
            else:
                return self.opt_params
        self.opt_key = [(group["params"], len(group["params"])) for group in groups]
        self.opt_params = params = [(gi, p) for gi, group in enumerate(groups) for p in group["params"]]
        self.opt_flat = [p for _, p in params]
        n = len(params)
        chosen = set(range(0, n, max(1, n // SENTINELS)))
        if n:
            # the last and the largest, and the largest trainable one: a sentinel that has a gradient where
            # only part of the model trains (a frozen backbone) saves the whole scan on every step
            trainable = [i for i in range(n) if params[i][1].requires_grad] or [0]
            chosen |= {n - 1, max(range(n), key=lambda i: params[i][1].numel()),
                       max(trainable, key=lambda i: params[i][1].numel())}
        self.sentinels = [params[i][1] for i in sorted(chosen)]
        self.sentinel_trainable = []  # (a new set: the next step scans whole)
        return params

    def same_params(self, optimizer: Any) -> bool:
        """Whether the optimizer still holds the parameters flattened last, in order (identity only)."""
        lists = [group["params"] for group in optimizer.param_groups]
        flat = self.opt_flat
        return sum(map(len, lists)) == len(flat) and all(map(operator.is_, itertools.chain.from_iterable(lists), flat))

    def scan_due(self, step: int) -> bool:
        """Whether this step scans every parameter: the first steps, a sampled step, the step after a scan
        that found frozen parameters with gradients, a sentinel whose `requires_grad` changed (a freeze or
        an unfreeze) or a step where no sentinel has a gradient (it may be that none has)."""
        if step <= SCAN_WARMUP or step % self.ctx.every == 0 or self.rescan:
            return True
        if list(map(_requires_grad, self.sentinels)) != self.sentinel_trainable:
            return True  # (read in C: every step, a dozen tensors)
        for p in self.sentinels:
            if p.grad is not None:
                return False
        return True

    def scan(self, optimizer: Any, step: int, params: list[tuple[int, Any]]) -> list[tuple[int, Any]]:
        """The whole scan of the optimizer's parameters (`scan_due` says when); returns the parameters as
        scanned (flattened again if they changed)."""
        import torch

        ctx = self.ctx
        trainable = [p.requires_grad for p in self.sentinels]
        if (self.sentinel_trainable and trainable != self.sentinel_trainable) or not self.same_params(optimizer):
            # a freeze, an unfreeze or a parameter swapped inside a group: the sentinels are chosen again
            params = self.params_of(optimizer, again=True)
            trainable = [p.requires_grad for p in self.sentinels]
        self.sentinel_trainable = trainable
        # (read in C, a map a question: ~0.1 us a tensor; `.grad` of the frozen ones alone, and of the
        # others up to the first that has one)
        flat = self.opt_flat
        frozen = list(itertools.compress(flat, map(operator.not_, map(_requires_grad, flat))))
        frozen_with_grad = [p for p in frozen if p.grad is not None]
        if StepUpdatesNothing.name not in ctx.off:
            if frozen_with_grad or any(map(operator.is_not, map(_grad, flat), itertools.repeat(None))):
                self.no_grad_steps = []
            else:
                self.no_grad_steps.append(step)
                if len(self.no_grad_steps) >= 2:
                    frozen = [ctx.name(p, f"param_groups[{gi}]") for gi, p in params if not p.requires_grad]
                    ctx.report(StepUpdatesNothing.name, {
                        "steps": self.no_grad_steps[:10], "params_in_optimizer": len(params),
                        "requires_grad": sum(1 for _, p in params if p.requires_grad),
                        "frozen": len(frozen), "frozen_names": frozen[:MAX_NAMES],
                        "model_trainable": (sum(1 for p in ctx.module.parameters() if p.requires_grad)
                                            if ctx.module is not None else None),
                    }, step=self.no_grad_steps[0])
        if FrozenParamsUpdated.name not in ctx.off and FrozenParamsUpdated.name not in ctx.sent:
            frozen_params = frozen_with_grad[:FROZEN_TENSORS]
            self.rescan = bool(frozen_params)
            self.frozen_before = []
            with torch.no_grad():
                for p in frozen_params:
                    stride = max(1, p.numel() // 4096)
                    self.frozen_before.append((ctx.name(p), p, p.detach().reshape(-1)[::stride].clone(), stride))
        return params

    def frozen_after(self, step: int) -> None:
        """After the step: did the frozen tensors sampled before it change? (read on the background thread)"""
        import torch

        before, self.frozen_before = self.frozen_before, []
        with torch.no_grad():
            changed = torch.stack([
                (p.detach().reshape(-1)[::stride] != old).float().mean() for _, p, old, stride in before])
        names = [n for n, _, _, _ in before]
        ctx = self.ctx

        def then(values: list[float], item: Launched) -> None:
            moved = [(n, v) for n, v in zip(names, values) if v > 0]
            if moved:
                ctx.report(FrozenParamsUpdated.name, {
                    "names": [n for n, _ in moved][:MAX_NAMES], "count": len(moved),
                    "changed_share": {n: round(v, 4) for n, v in moved[:MAX_NAMES]},
                    "optimizer": type(ctx.guard.optimizer).__name__,
                }, step=item.step)

        ctx.launch(step, changed, then)


def _under_compile(frame: Any, depth: int = 6) -> bool:
    """Whether a hook's caller runs inside a torch.compile'd function.

    Dynamo runs the optimizer's hooks eagerly (they graph-break), so `torch.compiler.is_compiling()` is
    False there; the compiled function's wrapper (torch/_dynamo/eval_frame.py) or a resumed frame after a
    graph break (`torch_dynamo_resume_in_...`) is on the stack instead.
    """
    while frame is not None and depth > 0:
        code = frame.f_code
        if code.co_filename.endswith(os.path.join("_dynamo", "eval_frame.py")) or \
                code.co_name.startswith("torch_dynamo_resume_in"):
            return True
        frame, depth = frame.f_back, depth - 1
    return False
