"""The probe's hooks: the optimizer's half of each step, and a mark of progress at every forward where the
contract checks' forward pre-hook is not on the model (it counts the forwards itself: one hook a forward).

`OptimizerHooks.install` registers a pre- and a post-hook on the optimizer's `step` (torch >= 2.0). The
pre-hook reads what the step is about to use (the LR of each group, the scheduler's count, AMP's loss
scale) and, on the first `stats_every` steps and every `stats_every` after, launches the gradient norm and
a sample of the parameters; the post-hook launches the update ratio from that sample and closes the
step's optimizer half (probe/steps.py). All values stay on the device. The automatic probe
(probe/auto.py) gets the same hooks through the same `Guard` parts.
"""

from __future__ import annotations

import sys
import weakref
from typing import Any

from trainguard.contract import EVENT_PARAMS_NOT_IN_OPTIMIZER
from trainguard.probe import devicestats, planinfo, thisprocess
from trainguard.probe.capturegate import GATE
from trainguard.probe.eager import always_compiled, compile_checks, eager_hook
from trainguard.probe.state import ProbeState
from trainguard.probe.steps import StepRecorder, is_tensor


class OptimizerHooks:
    """Hooks on one optimizer (and a progress mark on the model): the optimizer's half of the step records
    the assembler (probe/steps.py) keeps in `records`."""

    def __init__(self, state: ProbeState, steps: StepRecorder, *, model: Any, scheduler: Any) -> None:
        self.state = state
        self.steps = steps
        self.model = model
        self.scheduler = scheduler
        self.handles: list[Any] = []  # the optimizer's two hooks
        self.model_params: list[Any] | None = None
        self._update_sample: list[Any] | None = None
        self._sampler = ParamSample()
        self.marker: ForwardMarker | None = None  # the forward mark on the model, when registered with kwargs
        # torch.compile's two tests, asked first in each optimizer hook, and the hooks through
        # `torch.compiler.disable` for when one is true (probe/eager.py)
        self._checks = compile_checks()
        self._off_compile: tuple[Any, Any] = (self.pre, self.post)
        if self._checks is not None and self._checks[1] is always_compiled:
            self._checks = None  # (no getter for the callback: the hooks are registered through eager_hook)
        elif self._checks is not None:
            import torch

            self._off_compile = (torch.compiler.disable(self.pre), torch.compiler.disable(self.post))

    def __deepcopy__(self, memo: dict) -> OptimizerHooks:
        return self  # an optimizer copied with its hooks shares them, as it shares the guard (probe/guard.py)

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        from trainguard.probe.detached import Detached

        return (Detached, ())  # a pickled optimizer's hooks carry no guard (probe/detached.py says why)

    def install(self) -> None:
        """Registers the hooks; an optimizer without step hooks (torch < 2.0) is dropped from the recorder."""
        s, model = self.steps, self.model
        if model is not None and hasattr(model, "parameters"):
            self.model_params = list(model.parameters())
            cuda = [p.device.index for p in self.model_params[:1] if p.device.type == "cuda"]
            if cuda:
                s.cuda_index = s.memory.cuda_index = cuda[0]
        optimizer = s.optimizer
        if optimizer is None:
            return
        try:
            pre, post = (self.pre, self.post) if self._checks is not None else (eager_hook(self.pre), eager_hook(self.post))
            self.handles = [optimizer.register_step_pre_hook(pre), optimizer.register_step_post_hook(post)]
        except AttributeError:
            self.state.selflog.write("optimizer has no step hooks (torch < 2.0?): optimizer steps counted from guard.step")
            s.optimizer = None
        if self.model_params is not None and s.optimizer is not None:
            in_opt = {id(p) for g in optimizer.param_groups for p in g["params"]}
            missing = [n for n, p in model.named_parameters() if p.requires_grad and id(p) not in in_opt]
            if missing:
                s.writer.add_event(EVENT_PARAMS_NOT_IN_OPTIMIZER, None, {
                    "count": len(missing), "names": missing[:20],
                    "total_trainable": sum(1 for p in self.model_params if p.requires_grad),
                })

    def install_marker(self) -> None:
        """The forward mark on the model, where the contract checks' forward pre-hook does not count its
        forwards already (they are off, or could not attach): one hook a forward either way."""
        model = self.model
        if model is None or not hasattr(model, "register_forward_hook"):
            return
        marker = ForwardMarker(self.state)
        try:
            try:
                model.register_forward_hook(marker, with_kwargs=True)
                self.marker = marker
            except TypeError:  # a model whose forward hooks take no keyword arguments
                model.register_forward_hook(marker)
        except Exception as exc:
            self.state.fail("forward hook", exc)

    def remove_optimizer_hooks(self) -> None:
        """The optimizer's hooks come off (the automatic probe retiring)."""
        for handle in self.handles:
            handle.remove()

    def pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        checks = self._checks
        if checks is not None and (checks[0]() or checks[1]() is not None):
            # under torch.compile: this same method again, through `torch.compiler.disable` (probe/eager.py
            # says why). Eagerly the tests are all it costs: no wrapper's frame.
            return self._compiled(0, optimizer, args, kwargs)
        s, st = self.steps, self.state
        if st.disabled or thisprocess.pid != st.pid or GATE.capturing and GATE.here():
            return  # (a step captured into a CUDA graph is recorded, not taken; its replays run no hook)
        try:
            if s.fast_forward.active:
                s.fast_forward.before_opt_step()
            step = st.opt_steps + 1
            records = s.records
            rec = records.get(step)
            if rec is None:
                rec = records[step] = {"step": step}
            groups = optimizer.param_groups
            lr = groups[0].get("lr") if groups else None
            if type(lr) is float:
                rec["lr"] = lr  # the common case, asked first
            elif is_tensor(lr):
                rec.setdefault("opt_tensors", []).append(("lr", devicestats.snapshot_scalar(lr)))
            elif lr is not None:
                rec["lr"] = float(lr)
            if len(groups) > 1:
                rec["lrs"] = [float(g["lr"]) if not is_tensor(g["lr"]) else None for g in groups]
            scheduler = self.scheduler
            if scheduler is not None:
                epoch = getattr(scheduler, "last_epoch", None)
                rec["sched_epoch"] = epoch if type(epoch) is int else planinfo.sched_epoch(scheduler)
            if s.scaler is None and step <= 3:
                s.scaler = _calling_scaler()  # a GradScaler not given to watch(): the one stepping this optimizer
            if s.scaler is not None:
                scale = getattr(s.scaler, "_scale", None)  # a device tensor; get_scale() would sync
                if scale is not None:
                    rec.setdefault("opt_tensors", []).append(("loss_scale", devicestats.snapshot_scalar(scale)))
            every = s.stats_every
            if step <= every or step % every == 0:
                self._grad_stats(optimizer, rec)
        except Exception as exc:
            st.fail("optimizer pre-hook", exc)
        contracts = s.contracts
        if contracts is not None:
            try:
                contracts.opt_pre(optimizer)  # (fail-open inside, check by check)
            except Exception as exc:
                st.fail("contract checks", exc)

    def post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        checks = self._checks
        if checks is not None and (checks[0]() or checks[1]() is not None):
            return self._compiled(1, optimizer, args, kwargs)  # (as in `pre`)
        s, st = self.steps, self.state
        if thisprocess.pid != st.pid or GATE.capturing and GATE.here():
            return
        st.opt_steps += 1  # counted even when switched off: `due()` depends on it
        if st.disabled:
            return
        handoff = s.handoff
        try:
            ratio = None
            if handoff.update_snapshot is not None:
                before = handoff.update_snapshot
                handoff.update_snapshot = None
                after = self._sampler.take(self._update_sample or [])
                import torch

                delta = torch.linalg.vector_norm(after - before)
                ratio = delta / (torch.linalg.vector_norm(before) + 1e-12)
            s.opt_step_done(ratio)
        except Exception as exc:
            st.fail("optimizer post-hook", exc)
        contracts = s.contracts
        if contracts is not None:
            try:
                contracts.opt_post(optimizer)
            except Exception as exc:
                st.fail("contract checks", exc)
        if not s.uses_step and s.fast_forward.active:
            s.fast_forward.after_step()  # a loop without guard.step is stopped here (preflight only)

    def _compiled(self, which: int, optimizer: Any, args: Any, kwargs: Any) -> None:
        """A hook called under torch.compile: called again through `torch.compiler.disable`, its tests
        switched off meanwhile (they could stay true there, under torch.export's flag: no recursion)."""
        checks, self._checks = self._checks, None
        try:
            self._off_compile[which](optimizer, args, kwargs)
        finally:
            self._checks = checks

    def _grad_stats(self, optimizer: Any, rec: dict[str, Any]) -> None:
        import torch

        params = [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad]
        grads = [grad for grad in (p.grad for p in params) if grad is not None and not grad.is_sparse]
        if grads:
            if self.steps.cuda_index is None and grads[0].is_cuda:
                self.steps.cuda_index = self.steps.memory.cuda_index = grads[0].device.index
            norms = torch._foreach_norm(grads)
            # one stack (promoting mixed dtypes) and one cast, not a cast per tensor
            total = torch.linalg.vector_norm(torch.stack(norms).float())
            rec.setdefault("opt_tensors", []).append(("grad_norm", total))
        rec["no_grad"] = len(params) - len(grads)
        if rec["no_grad"] and _checkpoint_warned():
            rec["checkpoint_no_grad"] = True  # why they have none: params-without-grad names the cause
        if self._update_sample is None:
            # The update ratio is read from a few tensors, not all: the largest ones (where a model's
            # weights are) plus the first and the last. Each sampled tensor costs a launch or two, and
            # a GPT-sized model has hundreds; a few suffice to see weights that do not move.
            watched = [p for p in (self.model_params or params) if p.requires_grad]
            by_size = sorted(watched, key=lambda p: p.numel(), reverse=True)[:6]
            chosen = {id(p): p for p in [watched[0], *by_size, watched[-1]]} if watched else {}
            self._update_sample = list(chosen.values())
        if self._update_sample:
            self.steps.handoff.update_snapshot = self._sampler.take(self._update_sample)

class ForwardMarker:
    """A forward hook on the watched model's top module: every forward is progress for the watchdog (an
    evaluation over the same model included), at the cost of a counter. Registered only where the contract
    checks' forward pre-hook, which counts the same, is not on the model (probe/contracts.py). It holds the
    probe's state weakly, and is kept out of `torch.compile` graphs (a counter traced into a graph would be read
    as a constant and guarded on).

    An object, not a closure, so that a model saved with its hooks pickles (as an inert `Detached`) and a
    deep-copied model shares it."""

    def __init__(self, state: ProbeState) -> None:
        self._ref = weakref.ref(state)
        self._checks: Any = None
        try:
            import torch

            self._mark = torch.compiler.disable(self._mark_now)
            # Why ask first: a call through the disabled wrapper costs ~8 us even when nothing compiles
            # (it switches dynamo's frame handling off and on); asking costs ~0.1 us.
            self._checks = compile_checks()
        except Exception:
            self._mark = self._mark_now

    def _mark_now(self) -> None:
        s = self._ref()
        if s is not None:
            s.ticks += 1

    def __call__(self, module: Any, args: Any, *rest: Any) -> None:
        # (module, args, kwargs, output) as registered with kwargs, else (module, args, output)
        checks = self._checks
        if checks is not None and not (checks[0]() or checks[1]() is not None):
            s = self._ref()  # eager: `_mark_now` written out (the plain call is the same as the disabled one)
            if s is not None:
                s.ticks += 1  # (progress counted: probe/steps.py says why not a clock read)
        else:
            self._mark()

    def __deepcopy__(self, memo: dict) -> ForwardMarker:
        return self

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        from trainguard.probe.detached import Detached

        return (Detached, ())


class ParamSample:
    """A strided sample of a few parameters, one float32 vector: before and after an update, their ratio.

    The strided views are made once and kept (the optimizer updates parameters in place, so a view sees
    the new values): a sample is then one concatenation instead of four operations per tensor. They are
    made again when a parameter's storage moved (`p.data = ...`, a model moved to another device), or
    when a parameter is not contiguous (its flat view would be a copy, taken anew each time)."""

    def __init__(self) -> None:
        self._params: list[Any] = []
        self._views: list[Any] | None = None
        self._ptrs: list[int] = []

    def take(self, params: list[Any]) -> Any:
        import torch

        ptrs = [p.data_ptr() for p in params]
        if self._views is None or ptrs != self._ptrs or params is not self._params:
            stride = max(1, sum(p.numel() for p in params) // 65536)
            views = [p.detach().reshape(-1)[::stride] for p in params]
            self._params, self._ptrs = params, ptrs
            contiguous = all(p.is_contiguous() for p in params)
            self._views = views if contiguous else None
        else:
            views = self._views
        flat = torch.cat(views)
        return flat if flat.dtype == torch.float32 else flat.float()


def _calling_scaler() -> Any:
    """The GradScaler whose `step(optimizer)` is running this optimizer step, found on the stack (the first
    3 steps only: a few frames looked at, then never again), or None. `watch()` without `scaler=` and the
    automatic probe record the loss scale all the same (clip-before-unscale reads it)."""
    import sys

    frame: Any = sys._getframe(2)
    for _ in range(8):
        if frame is None:
            return None
        code = frame.f_code
        if code.co_name in ("step", "_maybe_opt_step") and code.co_filename.endswith("grad_scaler.py"):
            scaler = frame.f_locals.get("self")
            return scaler if hasattr(scaler, "_scale") else None
        frame = frame.f_back
    return None


_CHECKPOINT_WARNING = "None of the inputs have requires_grad=True"


def _checkpoint_warned() -> bool:
    """Whether torch's reentrant checkpoint warned that none of its inputs require grad: then nothing inside
    the checkpointed block gets a gradient (LoRA adapters on a frozen model's blocks, the classic). Read from
    the warnings registry torch.utils.checkpoint keeps (its own `warnings.warn`, stacklevel 2, lands there):
    no hook, no cost, and it works whatever the script's warning filters print."""
    mod = sys.modules.get("torch.utils.checkpoint")
    registry = getattr(mod, "__warningregistry__", None) if mod is not None else None
    if not isinstance(registry, dict):
        return False
    return any(isinstance(k, tuple) and k and str(k[0]).startswith(_CHECKPOINT_WARNING) for k in list(registry))
