"""Autocast that does not reach the model (autocast-runs-fp32): autocast on for another device than the
model's, a GradScaler on CUDA without autocast, or autocast disabled inside the model for most of its
largest layers.

On a sampled step's first training forward (the first three steps, then every `AUTOCAST_SAMPLES`-th
sample) the autocast state is read and, where autocast is on, forward hooks on the largest layers read
their output dtypes for that one forward; the dispatcher's post-hook takes them off (`post`). Metadata
only: no device work.
"""

from __future__ import annotations

from typing import Any

from trainguard.probe.contract_context import MAX_NAMES, CheckContext, first_tensor
from trainguard.rules.contracts_data import AutocastRunsFp32

AUTOCAST_FP32_SHARE = 0.5  # of the largest layers' weights computing in fp32 inside autocast
AUTOCAST_SAMPLES = 10  # sampled steps per autocast check past the first three steps
AUTOCAST_LAYERS = 8  # the largest layers whose output dtype is read on a sampled forward


class AutocastChecks:
    """The autocast state and the largest layers' output dtypes on a sampled forward."""

    def __init__(self, ctx: CheckContext) -> None:
        self.ctx = ctx
        self.big_layers: list[tuple[str, Any, int]] = []
        self.device_type: str | None = None
        self.scaler_no_autocast: list[int] = []
        self.step = 0  # the sampled step whose first training forward was looked at last
        # The layers' hooks on for the forward under way. The same list is the dispatcher's `autocast_hooks`
        # (its forward pre-hook asks it at every forward): changed in place, never replaced.
        self.hooks: list[Any] = []
        self.seen: list[tuple[str, str, int, str]] = []  # layer, output dtype, size, autocast dtype

    def survey(self, model: Any) -> None:
        """The model's largest layers, and the device it is on (a model found later replaces them)."""
        from torch import nn

        self.big_layers = []
        for name, m in model.named_modules():
            if isinstance(m, (nn.Linear, nn.Bilinear, nn.modules.conv._ConvNd)):
                size = sum(p.numel() for p in m.parameters(recurse=False))
                self.big_layers.append((name, m, size))
        self.big_layers = sorted(self.big_layers, key=lambda t: -t[2])[:AUTOCAST_LAYERS]
        first = next(iter(model.parameters()), None)
        self.device_type = first.device.type if first is not None else None

    def due(self, step: int) -> bool:
        """Whether this sampled step checks autocast: the first three, then every AUTOCAST_SAMPLES-th
        sample (its layer hooks, registered and removed, cost ~30 us; a loop's autocast rarely changes)."""
        name = AutocastRunsFp32.name
        ctx = self.ctx
        return (step <= 3 or step % (ctx.every * AUTOCAST_SAMPLES) == 0) and name not in ctx.off and name not in ctx.sent

    def pre(self, step: int) -> None:
        """Before a sampled step's first training forward: autocast on for the model's device puts the
        layers' hooks on; off, it may be on for another device, or a GradScaler may run without it."""
        ctx = self.ctx
        on = {d: _autocast_on(d) for d in ("cuda", "cpu")}
        if ctx.module is None:  # (not reached: the forward hooks that call this are the module's)
            return
        first = next(iter(ctx.module.parameters()), None)  # where the model is now (it may have moved)
        dev = self.device_type = first.device.type if first is not None else None
        if dev not in on:
            return
        if on[dev]:
            self.scaler_no_autocast = []
            self.seen = []
            dtype = str(_autocast_dtype(dev)).replace("torch.", "")
            for name, m, size in self.big_layers:
                self.hooks.append(m.register_forward_hook(self._layer_dtype(name, size, dtype)))
            return
        other = [d for d, enabled in on.items() if enabled]
        if other:
            ctx.report(AutocastRunsFp32.name, {
                "cause": "other-device", "autocast_device": other[0], "model_device": dev, "step": step,
                "layers": [n for n, _, _ in self.big_layers[:MAX_NAMES]],
            }, step=step)
        elif dev == "cuda" and _scaler_enabled(ctx.guard.scaler) and torch_is_fp32(ctx.module):
            # (CUDA only: a GradScaler exists for fp16 autocast there; on the CPU it is a deliberate choice)
            self.scaler_no_autocast.append(step)
            if len(self.scaler_no_autocast) >= 3:
                ctx.report(AutocastRunsFp32.name, {
                    "cause": "no-autocast", "model_device": dev, "steps": self.scaler_no_autocast[:10],
                    "scaler": type(ctx.guard.scaler).__name__,
                    "layers": [n for n, _, _ in self.big_layers[:MAX_NAMES]],
                }, step=self.scaler_no_autocast[0])

    def _layer_dtype(self, name: str, size: int, autocast_dtype: str) -> Any:
        def hook(module: Any, args: Any, output: Any) -> None:
            out = first_tensor(output)
            if out is not None and out.is_floating_point():
                self.seen.append((name, str(out.dtype).replace("torch.", ""), size, autocast_dtype))

        return hook

    def post(self) -> None:
        """After the sampled forward: the layers' hooks come off, and their dtypes are judged."""
        for h in self.hooks:
            h.remove()
        del self.hooks[:]
        seen, self.seen = self.seen, []
        if not seen:
            return
        total = sum(s for _, _, s, _ in seen)
        fp32 = [(n, d, s) for n, d, s, _ in seen if d == "float32"]
        share = sum(s for _, _, s in fp32) / total if total else 0.0
        if share > AUTOCAST_FP32_SHARE:
            self.ctx.report(AutocastRunsFp32.name, {
                "cause": "disabled-inside", "autocast_dtype": seen[0][3], "model_device": self.device_type,
                "fp32_share": round(share, 3), "layers": [n for n, _, _ in fp32[:MAX_NAMES]],
                "layers_checked": len(seen), "step": self.step,
            }, step=self.step)


def _autocast_on(device: str) -> bool:
    import torch

    try:
        return bool(torch.is_autocast_enabled(device))
    except TypeError:  # torch < 2.4: no device argument
        return bool(torch.is_autocast_enabled() if device == "cuda" else torch.is_autocast_cpu_enabled())


def _autocast_dtype(device: str) -> Any:
    import torch

    try:
        return torch.get_autocast_dtype(device)
    except (AttributeError, TypeError):
        return torch.get_autocast_gpu_dtype() if device == "cuda" else torch.get_autocast_cpu_dtype()


def _scaler_enabled(scaler: Any) -> bool:
    if scaler is None:
        return False
    enabled = getattr(scaler, "is_enabled", None)
    return bool(enabled()) if callable(enabled) else True


def torch_is_fp32(module: Any) -> bool:
    import torch

    first = next(iter(module.parameters()), None) if module is not None else None
    return first is not None and first.dtype == torch.float32
