"""Shapes the training code gets wrong without an error: a batch that reaches the model without its batch
dimension (batch-dim-lost), and a loss that broadcasts a (B, 1) output against a (B,) target to (B, B)
(loss-broadcasts-batch).

The batch dimension is judged on every training forward from shapes alone (the dispatcher's forward
pre-hook runs the usual case inline, `batch_dim` the rest). The loss check keeps a sampled forward's
(B,) or (B, 1) output for that micro-batch's `guard.step`, which compares the loss with its broadcast-free
twin: a few small kernels, copied to the host without a sync and read by the background thread.
"""

from __future__ import annotations

from typing import Any

from trainguard.probe.capturegate import GATE
from trainguard.probe.contract_context import CheckContext, Launched, first_tensor, tensors
from trainguard.rules.contracts_data import BatchDimLost, LossBroadcastsBatch

BATCH_SHAPES_LEARNED = 3  # training forwards whose first input has one rank before a rank one less is judged


class ShapeChecks:
    """The model's first input against the batches before it; the loss against the output's shape."""

    def __init__(self, ctx: CheckContext) -> None:
        self.ctx = ctx
        # (the batch shapes learned, `batch_shapes` and `batch_ndim`, are the context's: the forward
        # pre-hook's fast path reads them at every forward)
        self.last_output: Any = None  # a sampled forward's output, kept for its micro-batch's loss
        self.last_output_step = 0  # ... that micro-batch (counted as `guard.step` will count it)
        self.loss_step = 0  # the last micro-batch whose loss was compared

    # ------------------------------------------------------------------------------------------------
    # the batch dimension

    def batch_dim(self, args: Any, kwargs: Any) -> None:
        """A training forward whose first input lost its batch dimension (a batch of 1 squeezed).

        Every training forward, not a sample: the batch of 1 is typically the last of an epoch, one step
        in hundreds. Reads shapes only (no device work): the first input's rank is learned from the first
        forwards; one with a rank one less whose shape is their shape without the leading dimension is a
        batch that lost it (`x.squeeze()` on a batch of 1, a collate that drops the dimension). Modules
        that accept unbatched input (Linear, Conv, RNN, attention, cross_entropy) then run silently.
        """
        ctx = self.ctx
        x = args[0] if args and isinstance(args[0], ctx.tensor_type) else None  # the common case, fast
        if x is None:
            x = first_tensor(args) if args else None
        if x is None and kwargs:
            x = first_tensor(list(kwargs.values()))
        if x is None:
            return
        shape = x.shape  # a torch.Size: a tuple, compared without copying
        if ctx.batch_ndim is None:
            ctx.batch_shapes.append(shape)
            if len(ctx.batch_shapes) >= BATCH_SHAPES_LEARNED:
                ranks = {len(s) for s in ctx.batch_shapes}
                if len(ranks) == 1 and min(ranks) >= 1:
                    ctx.batch_ndim = ranks.pop()
                else:
                    ctx.off.add(BatchDimLost.name)  # a model fed inputs of several ranks: nothing to judge
            return
        if len(shape) == ctx.batch_ndim:
            ctx.batch_shapes[-1] = shape  # the latest batched shape (sequence lengths may vary)
            return
        if len(shape) != ctx.batch_ndim - 1:
            return
        usual = ctx.batch_shapes[-1]
        loader = self.loader_batch_shape()
        if shape != usual[1:] and not (loader and loader[0] == 1 and tuple(loader[1:]) == shape):
            return
        g = ctx.guard
        ctx.report(BatchDimLost.name, {
            "input_shape": list(shape), "usual_shape": list(usual), "loader_shape": list(loader) if loader else None,
            "micro_batch": g.micro + 1, "model": type(ctx.module).__name__,
        }, step=g.step_count + 1)

    def loader_batch_shape(self) -> tuple[int, ...] | None:
        """The shape of the first tensor of the batch last read through `guard.batches`, if any."""
        items = getattr(self.ctx.guard.ring, "items", None)
        if not items:
            return None
        t = first_tensor(items[-1][1])
        return tuple(int(d) for d in t.shape) if t is not None else None

    # ------------------------------------------------------------------------------------------------
    # the loss: a (B, 1) output against a (B,) target broadcasts to (B, B)

    def keep_output(self, output: Any) -> None:
        """A sampled training forward's output, kept for this micro-batch's loss when its shape is one the
        broadcast needs."""
        out = first_tensor(output)
        # (B,) or (B, 1) only: the shapes the broadcast bug needs, and small enough to hold on to
        if out is not None and out.requires_grad and (out.dim() == 1 or out.dim() == 2 and out.shape[1] == 1):
            g = self.ctx.guard
            # kept for this micro-batch's `guard.step` (which counts it as micro + 1)
            self.last_output, self.last_output_step = out.detach(), g.micro + 1
            g.output_kept = True  # (guard.step asks this one attribute, not the checks, every micro-batch)

    def on_loss(self, loss: Any) -> None:
        """Called by `guard.step` with the micro-batch's loss (training thread)."""
        ctx = self.ctx
        g = ctx.guard
        micro = g.micro  # already counted by guard.step
        out = self.last_output
        if GATE.capturing:
            return  # (its pinned copy would invalidate a CUDA graph capture: probe/capturegate.py)
        if out is None or self.last_output_step != micro or self.loss_step == micro:
            if out is None or self.last_output_step < micro:  # (kept for a micro-batch that passed)
                self.last_output = None
                g.output_kept = False
            return
        self.loss_step = micro
        self.last_output = None
        g.output_kept = False
        step = g.step_count
        if LossBroadcastsBatch.name in ctx.off or LossBroadcastsBatch.name in ctx.sent:
            return
        try:
            self._loss_broadcast(loss, out, step)
        except Exception as exc:
            ctx.failed(LossBroadcastsBatch.name, exc)

    def _loss_broadcast(self, loss: Any, out: Any, step: int) -> None:
        import torch

        ctx = self.ctx
        g = ctx.guard
        if not (hasattr(loss, "detach") and loss.numel() == 1) or not g.ring.items:
            return
        micro, batch, _ = g.ring.items[-1]
        if micro != g.micro:
            return  # the batch did not come through guard.batches just before this loss
        target = None
        for t in tensors(batch, limit=8):
            if (t.is_floating_point() and t.shape != out.shape and t.numel() == out.numel() and t.numel() > 1
                    and t.dim() in (1, 2)):
                target = t
                break
        if target is None:
            return
        if out.device.type == "cuda" and target.device.type == "cpu":
            # from pinned memory the copy is truly asynchronous; from pageable memory it would wait
            target = target.pin_memory()
        y = target.to(out.device, non_blocking=True).to(out.dtype)
        with torch.no_grad():
            wide = out - y  # what the loss computes when it broadcasts: (B, B)
            if wide.numel() <= out.numel():
                return
            aligned = out.reshape(-1) - y.reshape(-1)
            vec = torch.stack([
                loss.detach().float().reshape(()),
                wide.pow(2).mean().float(), aligned.pow(2).mean().float(),
                wide.abs().mean().float(), aligned.abs().mean().float(),
                wide.pow(2).sum().float(), aligned.pow(2).sum().float(),
            ])
        shapes = {"output_shape": list(out.shape), "target_shape": list(target.shape),
                  "broadcast_shape": list(wide.shape)}
        accum = g.grad_accum

        def then(values: list[float], item: Launched) -> None:
            loss_v, *pairs = values
            for kind, (bc, al) in zip(("mse", "l1", "sum of squares"), zip(pairs[0::2], pairs[1::2])):
                for scale in {1.0, 1.0 / accum}:
                    if _close(loss_v, bc * scale) and not _close(loss_v, al * scale, tol=1e-2):
                        ctx.report(LossBroadcastsBatch.name, {
                            **shapes, "loss": loss_v, "loss_kind": kind, "loss_without_broadcast": al * scale,
                        }, step=item.step)
                        return

        ctx.launch(step, vec, then)


def _close(a: float, b: float, tol: float = 1e-4) -> bool:
    return abs(a - b) <= tol * max(abs(a), abs(b), 1e-12)
