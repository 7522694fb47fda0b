"""API contracts the training code must keep, checked by the probe where the code runs (issue 20).

Loss, LR and gradient-norm rules miss a class of bugs that break an API's contract silently: an
optimizer step that updates nothing, or updates what the user froze; gradients never reset; a model
left in training mode for evaluation; a loss that broadcasts a (B, 1) output against a (B,) target; a
batch that reaches the model without its batch dimension; autocast that does not reach the model; DDP replicas drifting apart. TrainCheck (OSDI 2025) infers such
invariants from reference runs; here each is hard-coded from the API's semantics, so no reference run
is needed, and each is checked on a sample of steps (the first three, then every `stats_every`), or,
where a late trigger must not wait for a sample, on every step through a cheap early-out:

- the optimizer's parameters are scanned whole (`requires_grad`, `.grad`: ~0.4 us a tensor) on the
  first `SCAN_WARMUP` steps, every `stats_every` steps, and on any step where one of a few evenly spaced
  sentinel parameters changed `requires_grad` or has no gradient; otherwise the sentinels alone are read;
- the gradient of one parameter is followed from each optimizer step by one tensor hook, taken out of
  the parameter's hook dictionary as soon as the window's reset is seen (by the forward pre-hook when
  `zero_grad()` comes before the forward, else by the first backward pass): in the usual loop no call
  or one from backward a step; the autocast check, which registers hooks on the largest layers for one
  forward, runs on the first three steps and every tenth sample after;
- most checks read metadata only (`requires_grad`, a gradient's identity and version counter,
  `module.training`, the autocast state, dtypes and shapes): no device work at all;
- the few that need numbers (did a frozen tensor change? a parameter checksum for DDP; the loss against
  its broadcast-free twin) launch a few small kernels on a sampled step and copy the result to the host
  without a sync; the probe's background thread reads it later (`drain`).

What a check sees becomes a "contract" event (name = the rule's name, data = the evidence). The rules in
`rules/contracts.py` turn the events into findings, so `trainguard diagnose` reads the same thing later.
Everything here is fail-open: a check that raises is switched off and logged once through the guard.
While a CUDA graph capture is open in the process the hooks return at once (probe/capturegate.py).
"""

from __future__ import annotations

import itertools
import operator
import os
import sys
import time
import weakref
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from trainguard.contract import ENV_CONTRACTS
from trainguard.probe import devicestats, thisprocess, workerrng
from trainguard.probe.capturegate import GATE
from trainguard.probe.eager import compile_checks
from trainguard.rules.contracts import (
    AutocastRunsFp32,
    BatchDimLost,
    EvalBeforeTrainInit,
    EvalInTrainMode,
    EvalNotDeterministic,
    FrozenParamsUpdated,
    GradsNeverReset,
    LossBroadcastsBatch,
    ReplicasDiverged,
    StepUpdatesNothing,
    TrainInEvalMode,
    WorkersShareRng,
)

EVAL_PHASES = frozenset({"eval", "evaluate", "evaluation", "val", "valid", "validate", "validation", "test"})
NO_GRAD_STREAK = 3  # forwards in a row under no_grad in training mode, outside an eval phase: an eval loop
EVAL_MODE_STEPS = 3  # optimizer steps in a row trained in eval mode, after training mode was seen (TG217)
AUTOCAST_FP32_SHARE = 0.5  # of the largest layers' weights computing in fp32 inside autocast
AUTOCAST_SAMPLES = 10  # sampled steps per autocast check past the first three steps
AUTOCAST_LAYERS = 8  # the largest layers whose output dtype is read on a sampled forward
CHECKSUM_TENSORS = 8  # parameter tensors in the DDP checksum
CHECKSUM_ELEMENTS = 1 << 16  # elements per tensor at most (strided sample)
FROZEN_TENSORS = 16  # frozen tensors compared around a sampled optimizer step
MAX_NAMES = 10
BATCH_SHAPES_LEARNED = 3  # training forwards whose first input has one rank before a rank one less is judged
SCAN_WARMUP = 10  # optimizer steps whose parameters are all scanned before the scan thins out
REWATCH_IDLE = 50  # windows without a backward pass into the watched parameter: look for another at 2, 52, ...
SENTINELS = 8  # evenly spaced parameters read every step (plus the first, last and largest)

_BATCH_DIM = BatchDimLost.name
_requires_grad = operator.attrgetter("requires_grad")
_grad = operator.attrgetter("grad")


@dataclass
class _Launched:
    """Device numbers on their way to the host, with what to do once they arrive."""

    step: int
    host: Any
    event: Any
    then: Any  # callable(values: list[float]) run on the background thread
    extra: dict[str, Any] = field(default_factory=dict)

    def ready(self) -> bool:
        return self.event is None or self.event.query()


class _GradWatch:
    """One parameter whose gradient is followed from an optimizer step to the next (grads-never-reset).

    One tensor hook, run on the autograd engine's thread before a backward pass adds to `.grad`. The
    optimizer's post-hook records the gradient the step left (held weakly: a freed gradient whose id a
    new one reuses cannot pass for it) and its version counter, what the window's first backward pass
    finds if nothing reset it, and puts the hook in place. A pass that finds them adds to that gradient in
    place, so the next pass expects the version one higher. The first pass that finds anything else (no
    gradient, another tensor, another version: set to None, replaced, zeroed) marks the window reset and
    takes the hook out of the parameter's hook dictionary until the next step: in the usual loop one
    call a window (each call takes the interpreter lock back in the middle of a backward pass). The
    window is judged at the next optimizer step.
    """

    __slots__ = ("name", "param", "ref", "version", "passes", "start", "reset_at", "idle", "windows",
                 "handle", "hooks", "key", "fn", "armed", "decided", "error")

    def __init__(self, name: str, param: Any) -> None:
        self.name = name
        self.param = param
        self.ref: Any = None  # weakref to the gradient the next pass must find; None: a reset was seen
        self.version = 0  # ... and its version counter
        self.passes = 0  # backward passes the hook saw
        self.start = 0  # `passes` at the window's start (the last optimizer step)
        self.reset_at = 0  # `passes` before the last reset seen
        self.idle = 0  # windows in a row that no backward pass reached
        self.windows: list[int] = []  # optimizer steps whose window had no reset
        self.handle: Any = None
        self.hooks: Any = None  # the parameter's tensor-hook dictionary, where the hook is put and taken out
        self.key: Any = None
        self.fn: Any = None  # the hook as it stood in the dictionary (a benchmark may have wrapped it)
        self.armed = False
        self.decided = False  # the window's reset was seen before its first forward (`before_forward`)
        self.error: BaseException | None = None  # what the hook raised (it never raises into backward)

    def install(self) -> None:
        self.handle = self.param.register_hook(self.hook())
        self.hooks, self.key = self.param._backward_hooks, self.handle.id
        self.fn, self.armed = self.hooks[self.key], True

    def arm(self) -> None:
        if not self.armed:
            self.armed = True
            self.hooks[self.key] = self.fn

    def disarm(self) -> None:
        # (torch calls the hooks of a pass from a snapshot of the dictionary: taking one out is safe)
        if self.armed:
            self.armed = False
            self.fn = self.hooks.pop(self.key, self.fn)

    def remove(self) -> None:
        self.disarm()
        self.handle.remove()

    def before_forward(self) -> None:
        """A training forward, while the hook is in place: a reset already done (`zero_grad()` right after
        the step, the usual place) decides the window here, on the training thread, and the backward
        passes make no call at all. (A reset after the forward, before `backward()`, is left to them.)"""
        ref = self.ref
        if ref is None:
            return  # no gradient at the step: the first backward pass creates one (or none reaches it)
        g = self.param.grad
        if g is None or ref() is not g or g._version != self.version:
            self.ref = None
            self.reset_at = self.passes
            self.decided = True
            self.disarm()

    def hook(self) -> Any:
        # a closure, not a bound method: a deep-copied model shares it instead of copying the parameter
        def before_accumulate(grad: Any) -> None:
            self.passes += 1
            if GATE.capturing:
                return None  # a captured pass: its replays run no hook
            try:
                ref, g = self.ref, self.param.grad
                if ref is None or g is None or ref() is not g or g._version != self.version:
                    self.ref = None
                    self.reset_at = self.passes - 1
                    self.disarm()  # the window is decided: its later passes do not call in
                elif _accumulates(self.param):
                    self.version += 1  # this pass adds to it in place
            except Exception as exc:
                self.ref, self.error = None, exc
                self.disarm()
            return None

        return before_accumulate


def attach(guard: Any) -> Contracts | None:
    """The contract checks for this guard's model and optimizer (None when there is nothing to check)."""
    if guard.model is None and guard.optimizer is None or os.environ.get(ENV_CONTRACTS, "1") == "0":
        return None
    try:
        import torch  # noqa: F401  (the checks need torch; without it there is nothing to check)
    except ImportError:
        return None
    return Contracts(guard)


class Contracts:
    def __deepcopy__(self, memo: dict) -> Contracts:
        return self  # as Guard: a deep-copied model shares the checks its hooks are bound to

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        from trainguard.probe.detached import Detached

        return (Detached, ())  # as Guard: a pickled model's hooks carry no checks

    def __init__(self, guard: Any) -> None:
        import torch

        self.guard = guard
        self.every = max(1, int(guard.stats_every))
        self.sent: set[str] = set()  # contracts reported (one event each: the rule needs no more)
        self.off: set[str] = set()  # checks switched off after an error of their own
        self.launched: list[_Launched] = []
        self.handles: list[Any] = []
        model, opt = guard.model, guard.optimizer
        self.module = model if isinstance(model, torch.nn.Module) else None
        self.names: dict[int, str] = {}
        if self.module is not None:
            self.names = {id(p): n for n, p in self.module.named_parameters()}
        # -- optimizer contracts
        self.no_grad_steps: list[int] = []
        self.frozen_before: list[tuple[str, Any, Any, int]] = []
        self.step_compiled = False  # optimizer.step seen running under torch.compile
        self.grad_watch: list[_GradWatch] = []
        # Replicas are compared only where they must be identical: a DistributedDataParallel model (FSDP,
        # ZeRO and tensor parallelism hold different shards under the same names on each rank).
        ddp = getattr(getattr(torch.nn, "parallel", None), "DistributedDataParallel", None)
        replicated = ddp is not None and isinstance(model, ddp)
        self.world = int(os.environ.get("WORLD_SIZE", "1") or 1) if replicated else 1
        self.checksum_params: list[tuple[str, Any]] = []
        self.opt_key: list[tuple[Any, int]] | None = None  # each group's params list and its length, as scanned
        self.opt_params: list[tuple[int, Any]] = []  # (group index, parameter) of the optimizer
        self.opt_flat: list[Any] = []  # the same parameters alone
        self.sentinels: list[Any] = []
        self.sentinel_trainable: list[bool] = []  # their requires_grad at the last whole scan
        self.rescan = False  # the last whole scan found frozen parameters with gradients: scan the next step too
        if opt is not None:
            # (the optimizer's side, `opt_pre` and `opt_post`, is called from the guard's own step hooks,
            # probe/opthooks.py: one pair of hooks and compile checks a step for the whole probe)
            self._watch_grads(opt)
        # -- forward contracts
        self.mode_modules: list[tuple[str, Any]] = []
        self.bn_modules: list[tuple[str, Any]] = []
        self.big_layers: list[tuple[str, Any, int]] = []
        self.device_type: str | None = None
        self.train_forward_seen = False
        self.window_train = False  # a training-mode forward with gradients since the last optimizer step
        self.window_eval_grad = False  # ... an eval-mode forward with gradients (training in eval mode?)
        self.last_train_step = 0  # the last optimizer step a training-mode forward came before
        self.eval_mode_steps: list[int] = []  # optimizer steps in a row trained in eval mode only (TG217)
        self.eval_init_checked = False
        self.no_grad_streak = 0
        self.scaler_no_autocast: list[int] = []
        self.autocast_step = 0
        self.autocast_hooks: list[Any] = []
        self.autocast_seen: list[tuple[str, str, int, str]] = []  # layer, output dtype, size, autocast dtype
        self.rerunning = False
        self.det_checks = 0
        self.loss_step = 0
        self.last_output: Any = None
        self.last_output_step = 0
        self.tensor_type = torch.Tensor
        self.grad_enabled = torch.is_grad_enabled
        self.post_due = False  # the forward post-hook has something to do for the forward under way
        self.batch_shapes: list[tuple[int, ...]] = []  # the model's first input on the first training forwards
        self.batch_ndim: int | None = None  # their common rank, once BATCH_SHAPES_LEARNED of them agree
        # One hook a forward: the pre-hook, which also counts the forward as the guard's progress (an
        # evaluation's forwards included). The post-hook is put on only for a forward that needs it (a sampled
        # step's, about one in ten: `post_due`) and takes itself off (`_post_once`), since a hook on the model
        # costs every forward its call (and torch's slow path through `Module._call_impl`).
        self.post_handle: Any = None
        self._checks = compile_checks()
        self._disabled_hooks: tuple[Any, Any] = (self._forward_pre, self._post_once)
        if self._checks is not None:  # the two hooks through `torch.compiler.disable`, for `_rerun_disabled`
            self._disabled_hooks = (torch.compiler.disable(self._forward_pre), torch.compiler.disable(self._post_once))
        self.sight: Any = None  # zero-code runs: the global hooks that look for the model (probe/modulesight.py)
        if self.module is not None:
            self._survey(self.module)
            self.handles.append(self.module.register_forward_pre_hook(self._forward_pre, with_kwargs=True))
        # -- loader contracts
        self.workers = workerrng.Reports(guard.run_dir)
        self.last_worker_look = 0.0

    def adopt(self, module: Any, args: Any = None) -> None:
        """The model found without `watch()` (probe/modulesight.py): the forward checks attach to it as they
        attach to a watched model; a larger module found later (one that holds this one) takes its place.
        `args`: the inputs of the forward it was found in (that forward's hooks were taken before this one
        was registered, so it is checked here once)."""
        import torch

        for h in self.handles:
            h.remove()
        self.handles = []
        self.module = module
        self.names = {id(p): n for n, p in module.named_parameters()}
        for w in self.grad_watch:
            w.name = self.name(w.param, w.name)
        ddp = getattr(getattr(torch.nn, "parallel", None), "DistributedDataParallel", None)
        if ddp is not None and isinstance(module, ddp):
            self.world = int(os.environ.get("WORLD_SIZE", "1") or 1)
        self.mode_modules, self.bn_modules, self.big_layers = [], [], []
        self._survey(module)
        self.handles.append(module.register_forward_pre_hook(self._forward_pre, with_kwargs=True))
        if args is not None:
            self._forward_pre(module, args, {})

    # ------------------------------------------------------------------------------------------------
    # small helpers

    def sampled(self, step: int) -> bool:
        return step <= 3 or step % self.every == 0

    def name(self, p: Any, fallback: str = "?") -> str:
        return self.names.get(id(p), fallback)

    def report(self, name: str, data: dict[str, Any], step: int | None = None) -> None:
        """One contract event per contract and run: the rule makes the finding, more events add nothing."""
        if name in self.sent:
            return
        self.sent.add(name)
        self.guard._writer.add_event("contract", name, data, step=self.guard.step_count if step is None else step)

    def failed(self, check: str, exc: BaseException) -> None:
        self.off.add(check)
        self.guard.fail(f"contract check {check} (switched off)", exc)

    def launch(self, step: int, vec: Any, then: Any, **extra: Any) -> None:
        """Starts the copy of a small device vector to the host; `then(values)` runs when it is there."""
        host, event = vec, None
        if vec.device.type == "cuda":
            host, event = devicestats.copy_to_host(vec)
        self.launched.append(_Launched(step, host, event, then, extra))

    # ------------------------------------------------------------------------------------------------
    # the background thread

    def drain(self, final: bool = False) -> None:
        """Reads the device numbers that have arrived (in launch order) and runs their checks."""
        done = 0
        for item in list(self.launched):
            if not final and not item.ready():
                break
            if final and item.event is not None:
                item.event.synchronize()
            done += 1
            try:
                item.then(item.host.tolist(), item)
            except Exception as exc:
                self.guard.fail("contract check (device values)", exc)
        del self.launched[:done]
        now = time.time()
        if WorkersShareRng.name not in self.off and (final or now - self.last_worker_look > 1.0):
            self.last_worker_look = now
            try:
                found = self.workers.compare()
                if found:
                    self.report(WorkersShareRng.name, found)
            except Exception as exc:
                self.failed(WorkersShareRng.name, exc)

    # ------------------------------------------------------------------------------------------------
    # the loader: DataLoader workers that start with the same random state

    def loader(self, iterable: Iterable) -> None:
        if WorkersShareRng.name in self.off:
            return
        try:
            workerrng.wrap(iterable, self.workers)
        except Exception as exc:
            self.failed(WorkersShareRng.name, exc)

    # ------------------------------------------------------------------------------------------------
    # the optimizer: a step that updates nothing, or updates what is frozen; gradients never reset

    def _watch_grads(self, opt: Any) -> None:
        """Follows the gradient of one parameter, the largest trainable one, through the backward passes
        between optimizer steps (`_GradWatch`): no device work; a tensor hook called by backward passes
        only until the window's reset is seen, by the forward pre-hook or the first pass (each call takes
        the interpreter lock back in the middle of a backward pass, on the autograd engine's thread on a
        GPU). A parameter that backward passes stop reaching (frozen, unused) is exchanged for another
        (`_rewatch`)."""
        params = [p for g in opt.param_groups for p in g["params"] if p.requires_grad]
        if params:
            self._watch(max(params, key=lambda p: p.numel()))

    def _watch(self, p: Any) -> None:
        watch = _GradWatch(self.name(p, "param_groups[..]"), p)
        watch.install()
        self.grad_watch.append(watch)

    def _unwatch(self) -> None:
        """The gradient hooks come off (the contract reported, or its check switched off)."""
        for w in self.grad_watch:
            w.remove()
        self.grad_watch = []

    def _close_grad_window(self, step: int) -> None:
        for w in list(self.grad_watch):
            if w.error is not None:
                raise w.error
            if w.passes == w.start and not w.decided:  # no backward pass reached it since the last step
                w.idle += 1
                if w.idle % REWATCH_IDLE == 2:
                    self._rewatch(w)
                continue
            w.idle = 0
            if w.ref is None:
                continue  # reset in this window (or no step before it to compare with)
            # Not a streak: `zero_grad()` every other step (a misplaced `if`) leaves every second window
            # without a reset, and is as wrong.
            w.windows.append(step)
            if len(w.windows) >= 2:
                self.report(GradsNeverReset.name, {
                    "param": w.name, "steps": w.windows[:10], "backward_passes": w.passes - w.reset_at,
                    "grad_accum": self.guard.grad_accum,
                }, step=w.windows[0])
                self._unwatch()  # one event per run: nothing more to follow
                return

    def _rewatch(self, w: _GradWatch) -> None:
        """Two windows in a row without a backward pass into the watched parameter: if it is frozen or has
        no gradient, the largest trainable parameter that has one is watched instead."""
        p = w.param
        if p.requires_grad and p.grad is not None:
            return  # (its backward passes run inside the step: an LBFGS closure)
        others = [q for _, q in self.opt_params if q is not p and q.requires_grad and q.grad is not None]
        if others:
            w.remove()
            self.grad_watch.remove(w)
            self._watch(max(others, key=lambda q: q.numel()))

    def opt_pre(self, optimizer: Any) -> None:
        """The optimizer is about to step (called at the end of the guard's pre-hook, probe/opthooks.py)."""
        g = self.guard
        if g._disabled or GATE.capturing or thisprocess.pid != g._pid:
            return
        step = g.opt_steps + 1
        if not self.step_compiled and (step <= SCAN_WARMUP or step % (self.every * AUTOCAST_SAMPLES) == 0):
            # A compiled step that replays a no-op (pytorch/pytorch#115607) looks like any step that
            # changes nothing: knowing it runs under torch.compile names the cause. A few frames up, on
            # the first steps and every tenth sample until found (a loop compiles its step from the start).
            try:
                self.step_compiled = _under_compile(sys._getframe(2))  # above the guard's hook
                if self.step_compiled:
                    self.report("optimizer-step-compiled", {"optimizer": type(optimizer).__name__}, step=step)
            except Exception as exc:
                self.failed("optimizer-step-compiled", exc)
        for w in self.grad_watch:  # (one)
            if w.ref is None and (w.decided or w.passes != w.start) and w.error is None:
                w.idle = 0  # the usual window: reset before its forward, or seen so by its first backward pass
            else:
                try:
                    self._close_grad_window(step)
                except Exception as exc:
                    self._unwatch()
                    self.failed(GradsNeverReset.name, exc)
                break
        try:
            # Every step, cheaply: the sentinels' `requires_grad` and `.grad`, so a freeze mid-run that
            # touches one of them is seen at its first step; the whole scan on a sample of steps. Device
            # work only when the scan finds a frozen parameter with a gradient.
            params = self._params_of(optimizer)
            if params and not self._scan_due(step):
                if self.no_grad_steps:
                    self.no_grad_steps = []  # a sentinel has a gradient: the step updates something
                return
            if params:
                self._scan(optimizer, step, params)
        except Exception as exc:
            self.failed("optimizer step", exc)

    def _params_of(self, optimizer: Any, again: bool = False) -> list[tuple[int, Any]]:
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

    def _same_params(self, optimizer: Any) -> bool:
        """Whether the optimizer still holds the parameters flattened last, in order (identity only)."""
        lists = [group["params"] for group in optimizer.param_groups]
        flat = self.opt_flat
        return sum(map(len, lists)) == len(flat) and all(map(operator.is_, itertools.chain.from_iterable(lists), flat))

    def _scan_due(self, step: int) -> bool:
        """Whether this step scans every parameter: the first steps, a sampled step, the step after a scan
        that found frozen parameters with gradients, a sentinel whose `requires_grad` changed (a freeze or
        an unfreeze) or a step where no sentinel has a gradient (it may be that none has)."""
        if step <= SCAN_WARMUP or step % self.every == 0 or self.rescan:
            return True
        if list(map(_requires_grad, self.sentinels)) != self.sentinel_trainable:
            return True  # (read in C: every step, a dozen tensors)
        for p in self.sentinels:
            if p.grad is not None:
                return False
        return True

    def _scan(self, optimizer: Any, step: int, params: list[tuple[int, Any]]) -> None:
        """The whole scan of the optimizer's parameters (`_scan_due` says when)."""
        import torch

        trainable = [p.requires_grad for p in self.sentinels]
        if (self.sentinel_trainable and trainable != self.sentinel_trainable) or not self._same_params(optimizer):
            # a freeze, an unfreeze or a parameter swapped inside a group: the sentinels are chosen again
            params = self._params_of(optimizer, again=True)
            trainable = [p.requires_grad for p in self.sentinels]
        self.sentinel_trainable = trainable
        # (read in C, a map a question: ~0.1 us a tensor; `.grad` of the frozen ones alone, and of the
        # others up to the first that has one)
        flat = self.opt_flat
        frozen = list(itertools.compress(flat, map(operator.not_, map(_requires_grad, flat))))
        frozen_with_grad = [p for p in frozen if p.grad is not None]
        if StepUpdatesNothing.name not in self.off:
            if frozen_with_grad or any(map(operator.is_not, map(_grad, flat), itertools.repeat(None))):
                self.no_grad_steps = []
            else:
                self.no_grad_steps.append(step)
                if len(self.no_grad_steps) >= 2:
                    frozen = [self.name(p, f"param_groups[{gi}]") for gi, p in params if not p.requires_grad]
                    self.report(StepUpdatesNothing.name, {
                        "steps": self.no_grad_steps[:10], "params_in_optimizer": len(params),
                        "requires_grad": sum(1 for _, p in params if p.requires_grad),
                        "frozen": len(frozen), "frozen_names": frozen[:MAX_NAMES],
                        "model_trainable": (sum(1 for p in self.module.parameters() if p.requires_grad)
                                            if self.module is not None else None),
                    }, step=self.no_grad_steps[0])
        if FrozenParamsUpdated.name not in self.off and FrozenParamsUpdated.name not in self.sent:
            frozen_params = frozen_with_grad[:FROZEN_TENSORS]
            self.rescan = bool(frozen_params)
            self.frozen_before = []
            with torch.no_grad():
                for p in frozen_params:
                    stride = max(1, p.numel() // 4096)
                    self.frozen_before.append((self.name(p), p, p.detach().reshape(-1)[::stride].clone(), stride))
        if self.world > 1 and ReplicasDiverged.name not in self.off and not self.checksum_params and self.sampled(step):
            by_size = sorted(((self.name(p), p) for _, p in params), key=lambda np_: -np_[1].numel())
            self.checksum_params = list({id(p): (n, p) for n, p in
                                         [(self.name(params[0][1]), params[0][1]), *by_size[:CHECKSUM_TENSORS - 1]]
                                         }.values())

    def opt_post(self, optimizer: Any) -> None:
        """The optimizer stepped (called from the guard's post-hook, after it counted the step)."""
        g = self.guard
        if g._disabled or GATE.capturing or thisprocess.pid != g._pid:
            return
        step = g.opt_steps  # the guard's post-hook counted this step before calling
        if self.sight is not None and step >= self.sight.until:
            self.sight.close()  # the window for finding the model (zero-code runs) ends here
            self.sight = None
        for w in self.grad_watch:
            # The next window starts here: what the step (and clipping, unscaling before it) did to the
            # gradient is not a reset. Every window is followed (following only bursts of them carried a
            # window's state across the steps without hooks: a healthy Lightning run with accumulation 2
            # read as "not reset between optimizer steps 13, 23").
            gr = w.param.grad
            if gr is None:
                w.ref = None  # the next pass creates it: a reset
            else:
                w.ref, w.version = weakref.ref(gr), gr._version
            w.start, w.decided = w.passes, False
            w.arm()
        if self.window_train or self.window_eval_grad:
            try:
                self._close_mode_window(step)
            except Exception as exc:
                self.failed(TrainInEvalMode.name, exc)
        if self.frozen_before:
            try:
                self._frozen_after(step)
            except Exception as exc:
                self.failed(FrozenParamsUpdated.name, exc)
        if self.world > 1 and self.sampled(step) and ReplicasDiverged.name not in self.off:
            try:
                self._checksum(step)
            except Exception as exc:
                self.failed(ReplicasDiverged.name, exc)

    def _frozen_after(self, step: int) -> None:
        import torch

        before, self.frozen_before = self.frozen_before, []
        with torch.no_grad():
            changed = torch.stack([
                (p.detach().reshape(-1)[::stride] != old).float().mean() for _, p, old, stride in before])
        names = [n for n, _, _, _ in before]

        def then(values: list[float], item: _Launched) -> None:
            moved = [(n, v) for n, v in zip(names, values) if v > 0]
            if moved:
                self.report(FrozenParamsUpdated.name, {
                    "names": [n for n, _ in moved][:MAX_NAMES], "count": len(moved),
                    "changed_share": {n: round(v, 4) for n, v in moved[:MAX_NAMES]},
                    "optimizer": type(self.guard.optimizer).__name__,
                }, step=item.step)

        self.launch(step, changed, then)

    def _checksum(self, step: int) -> None:
        import torch

        if not self.checksum_params:
            return
        dist = torch.distributed
        if not (dist.is_available() and dist.is_initialized()):
            return
        with torch.no_grad():
            sums = torch.stack([p.detach().reshape(-1)[::max(1, p.numel() // CHECKSUM_ELEMENTS)].double().sum()
                                for _, p in self.checksum_params])
        names = [n for n, _ in self.checksum_params]
        rank = dist.get_rank()

        def then(values: list[float], item: _Launched) -> None:
            # one event per sampled step and rank: the rule compares ranks (this process sees only itself)
            self.guard._writer.add_event("contract", "param-checksum", {
                "rank": rank, "names": names, "sums": values}, step=item.step)

        self.launch(step, sums, then)

    # ------------------------------------------------------------------------------------------------
    # the model's forward: train mode in evaluation, evaluation before any training forward, autocast,
    # evaluation determinism (preflight), the output kept for the loss check

    def _survey(self, model: Any) -> None:
        from torch import nn

        for name, m in model.named_modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats:
                self.mode_modules.append((name, m))
                self.bn_modules.append((name, m))
            elif isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0:
                self.mode_modules.append((name, m))
            elif isinstance(m, nn.RNNBase) and m.dropout > 0 and m.num_layers > 1:
                self.mode_modules.append((name, m))
            if isinstance(m, (nn.Linear, nn.Bilinear, nn.modules.conv._ConvNd)):
                size = sum(p.numel() for p in m.parameters(recurse=False))
                self.big_layers.append((name, m, size))
        self.big_layers = sorted(self.big_layers, key=lambda t: -t[2])[:AUTOCAST_LAYERS]
        first = next(iter(model.parameters()), None)
        self.device_type = first.device.type if first is not None else None

    def _forward_pre(self, module: Any, args: Any, kwargs: Any) -> None:
        checks = self._checks
        if checks is not None and (checks[0]() or checks[1]() is not None):
            return self._rerun_disabled(0, module, args, kwargs)
        try:
            g = self.guard
            g._ticks += 1  # every forward of the watched model is progress (probe/steps.py: counted, not timed)
            if self.rerunning or g._disabled or GATE.capturing or thisprocess.pid != g._pid:
                self.post_due = False
                return
            training = module.training
            done = g.opt_steps if g.opt_steps > g._loss_steps else g._loss_steps  # g.step_count, without its call
            if training and self.grad_enabled():  # the usual forward: a few attribute reads
                self.train_forward_seen = True
                self.window_train = True
                self.no_grad_streak = 0
                for w in self.grad_watch:
                    if w.armed:  # (the window's first forward)
                        try:
                            w.before_forward()
                        except Exception as exc:
                            w.ref, w.error = None, exc
                if _BATCH_DIM not in self.sent and _BATCH_DIM not in self.off:
                    # an input of the learned rank: its shape remembered, without a call
                    x = args[0] if args else None
                    ndim = self.batch_ndim
                    if ndim is not None and isinstance(x, self.tensor_type) and len(shape := x.shape) == ndim:
                        self.batch_shapes[-1] = shape
                    else:
                        try:
                            self._batch_dim(args, kwargs)
                        except Exception as exc:
                            self.failed(_BATCH_DIM, exc)
            else:
                try:
                    if training:
                        self._train_mode_without_grad(module)
                    elif self.train_forward_seen:
                        self.window_eval_grad = self.window_eval_grad or self.grad_enabled()
                    elif not self.train_forward_seen and done > 0 and not self.eval_init_checked:
                        self.eval_init_checked = True  # once: it reads a device counter (a sync on a GPU)
                        self._eval_before_train()
                except Exception as exc:
                    self.failed("train/eval mode", exc)
            step = done + 1
            if training and (step <= 3 or step % self.every == 0):  # a sampled step's training forward
                if self.autocast_step != step:
                    self.autocast_step = step  # (its first forward only)
                    if self._autocast_due(step):
                        try:
                            self._autocast_pre(step)
                        except Exception as exc:
                            self.failed(AutocastRunsFp32.name, exc)
                # The post-hook keeps the output for the loss check and reads the autocast layers' dtypes.
                self.post_due = True
            else:
                # ... and is not needed, unless the autocast layers' hooks are still on (a sampled forward that
                # raised) or preflight evaluates (its second evaluation)
                self.post_due = bool(self.autocast_hooks) or (not training and g.fast_forward.active)
            if self.post_due and self.post_handle is None:
                try:
                    self.post_handle = module.register_forward_hook(self._post_once, with_kwargs=True)
                except Exception as exc:
                    self.failed("forward post-hook", exc)
        except Exception as exc:  # the guard never becomes the failure (a hook's error is the forward's)
            self.guard.fail("contract checks (forward)", exc)

    def _post_once(self, module: Any, args: Any, kwargs: Any, output: Any) -> None:
        """The post-hook of one forward: takes itself off, then does what the pre-hook said was due."""
        checks = self._checks
        if checks is not None and (checks[0]() or checks[1]() is not None):
            return self._rerun_disabled(1, module, args, kwargs, output)
        handle, self.post_handle = self.post_handle, None
        try:
            if handle is not None:
                handle.remove()
            self.forward_post(module, args, kwargs, output)
        except Exception as exc:  # the guard never becomes the failure (a hook's error is the forward's)
            self.guard.fail("contract checks (forward)", exc)

    def _rerun_disabled(self, which: int, *args: Any) -> None:
        """A forward hook called under torch.compile: called again through `torch.compiler.disable` (a graph
        break before or after the forward; traced, the guard's counters would become guarded constants),
        its tests switched off meanwhile (no recursion)."""
        checks, self._checks = self._checks, None
        try:
            self._disabled_hooks[which](*args)
        finally:
            self._checks = checks

    def _autocast_due(self, step: int) -> bool:
        """Whether this sampled step checks autocast: the first three, then every AUTOCAST_SAMPLES-th
        sample (its layer hooks, registered and removed, cost ~30 us; a loop's autocast rarely changes)."""
        name = AutocastRunsFp32.name
        return (step <= 3 or step % (self.every * AUTOCAST_SAMPLES) == 0) and name not in self.off and name not in self.sent

    def _batch_dim(self, args: Any, kwargs: Any) -> None:
        """A training forward whose first input lost its batch dimension (a batch of 1 squeezed).

        Every training forward, not a sample: the batch of 1 is typically the last of an epoch, one step
        in hundreds. Reads shapes only (no device work): the first input's rank is learned from the first
        forwards; one with a rank one less whose shape is their shape without the leading dimension is a
        batch that lost it (`x.squeeze()` on a batch of 1, a collate that drops the dimension). Modules
        that accept unbatched input (Linear, Conv, RNN, attention, cross_entropy) then run silently.
        """
        x = args[0] if args and isinstance(args[0], self.tensor_type) else None  # the common case, fast
        if x is None:
            x = _first_tensor(args) if args else None
        if x is None and kwargs:
            x = _first_tensor(list(kwargs.values()))
        if x is None:
            return
        shape = x.shape  # a torch.Size: a tuple, compared without copying
        if self.batch_ndim is None:
            self.batch_shapes.append(shape)
            if len(self.batch_shapes) >= BATCH_SHAPES_LEARNED:
                ranks = {len(s) for s in self.batch_shapes}
                if len(ranks) == 1 and min(ranks) >= 1:
                    self.batch_ndim = ranks.pop()
                else:
                    self.off.add(BatchDimLost.name)  # a model fed inputs of several ranks: nothing to judge
            return
        if len(shape) == self.batch_ndim:
            self.batch_shapes[-1] = shape  # the latest batched shape (sequence lengths may vary)
            return
        if len(shape) != self.batch_ndim - 1:
            return
        usual = self.batch_shapes[-1]
        loader = self._loader_batch_shape()
        if shape != usual[1:] and not (loader and loader[0] == 1 and tuple(loader[1:]) == shape):
            return
        g = self.guard
        self.report(BatchDimLost.name, {
            "input_shape": list(shape), "usual_shape": list(usual), "loader_shape": list(loader) if loader else None,
            "micro_batch": g.micro + 1, "model": type(self.module).__name__,
        }, step=g.step_count + 1)

    def _loader_batch_shape(self) -> tuple[int, ...] | None:
        """The shape of the first tensor of the batch last read through `guard.batches`, if any."""
        items = getattr(self.guard._ring, "items", None)
        if not items:
            return None
        t = _first_tensor(items[-1][1])
        return tuple(int(d) for d in t.shape) if t is not None else None

    def _train_mode_without_grad(self, module: Any) -> None:
        """A forward in training mode with gradients off: evaluation, unless it is a one-off."""
        if EvalInTrainMode.name in self.sent or not self.mode_modules:
            return
        phases = [p for p in self.guard.phases.stack if str(p).lower() in EVAL_PHASES]
        self.no_grad_streak += 1
        if not phases and self.no_grad_streak < NO_GRAD_STREAK:
            return
        active = [(n, m) for n, m in self.mode_modules if m.training]
        if not active:
            return  # the user switched the dropout and batch-norm layers to eval themselves
        self.report(EvalInTrainMode.name, {
            "model": type(module).__name__, "phase": phases[-1] if phases else None,
            "forwards": self.no_grad_streak,
            "modules": [f"{n or '(root)'} ({type(m).__name__})" for n, m in active[:MAX_NAMES]],
            "module_count": len(active),
        })

    def _close_mode_window(self, step: int) -> None:
        """An optimizer step whose forwards all ran in eval mode with gradients on, after the model had
        trained in training mode: `model.train()` not called after an evaluation (TG217), at
        EVAL_MODE_STEPS steps in a row. (Called only for a step that had a forward with gradients.)"""
        if self.window_train:
            self.last_train_step = step
            self.eval_mode_steps = []
        elif TrainInEvalMode.name not in self.sent and TrainInEvalMode.name not in self.off:
            self.eval_mode_steps.append(step)
            if len(self.eval_mode_steps) >= EVAL_MODE_STEPS:
                stuck = [(n, m) for n, m in self.mode_modules if not m.training]
                if stuck:
                    self.report(TrainInEvalMode.name, {
                        "model": type(self.module).__name__, "steps": self.eval_mode_steps[:10],
                        "last_train_step": self.last_train_step,
                        "modules": [f"{n or '(root)'} ({type(m).__name__})" for n, m in stuck[:MAX_NAMES]],
                        "module_count": len(stuck),
                    }, step=self.eval_mode_steps[0])
        self.window_train = self.window_eval_grad = False

    def _eval_before_train(self) -> None:
        """An eval-mode forward after optimizer steps, with no training-mode forward ever seen."""
        untouched = []
        for name, m in self.bn_modules:
            tracked = getattr(m, "num_batches_tracked", None)
            # Evaluation is rare and off the hot path: this reads one small counter, once per run.
            if tracked is not None and int(tracked) == 0:
                untouched.append(f"{name} ({type(m).__name__})")
        if untouched:
            self.report(EvalBeforeTrainInit.name, {
                "steps_trained": self.guard.step_count, "modules": untouched[:MAX_NAMES],
                "module_count": len(untouched), "model": type(self.module).__name__,
            })

    def _autocast_pre(self, step: int) -> None:
        on = {d: _autocast_on(d) for d in ("cuda", "cpu")}
        if self.module is None:  # (not reached: the forward hooks that call this are the module's)
            return
        first = next(iter(self.module.parameters()), None)  # where the model is now (it may have moved)
        dev = self.device_type = first.device.type if first is not None else None
        if dev not in on:
            return
        if on[dev]:
            self.scaler_no_autocast = []
            self.autocast_seen = []
            dtype = str(_autocast_dtype(dev)).replace("torch.", "")
            for name, m, size in self.big_layers:
                self.autocast_hooks.append(m.register_forward_hook(self._layer_dtype(name, size, dtype)))
            return
        other = [d for d, enabled in on.items() if enabled]
        if other:
            self.report(AutocastRunsFp32.name, {
                "cause": "other-device", "autocast_device": other[0], "model_device": dev, "step": step,
                "layers": [n for n, _, _ in self.big_layers[:MAX_NAMES]],
            }, step=step)
        elif dev == "cuda" and _scaler_enabled(self.guard.scaler) and torch_is_fp32(self.module):
            # (CUDA only: a GradScaler exists for fp16 autocast there; on the CPU it is a deliberate choice)
            self.scaler_no_autocast.append(step)
            if len(self.scaler_no_autocast) >= 3:
                self.report(AutocastRunsFp32.name, {
                    "cause": "no-autocast", "model_device": dev, "steps": self.scaler_no_autocast[:10],
                    "scaler": type(self.guard.scaler).__name__,
                    "layers": [n for n, _, _ in self.big_layers[:MAX_NAMES]],
                }, step=self.scaler_no_autocast[0])

    def _layer_dtype(self, name: str, size: int, autocast_dtype: str) -> Any:
        def hook(module: Any, args: Any, output: Any) -> None:
            out = _first_tensor(output)
            if out is not None and out.is_floating_point():
                self.autocast_seen.append((name, str(out.dtype).replace("torch.", ""), size, autocast_dtype))

        return hook

    def _autocast_post(self) -> None:
        for h in self.autocast_hooks:
            h.remove()
        self.autocast_hooks = []
        seen, self.autocast_seen = self.autocast_seen, []
        if not seen:
            return
        total = sum(s for _, _, s, _ in seen)
        fp32 = [(n, d, s) for n, d, s, _ in seen if d == "float32"]
        share = sum(s for _, _, s in fp32) / total if total else 0.0
        if share > AUTOCAST_FP32_SHARE:
            self.report(AutocastRunsFp32.name, {
                "cause": "disabled-inside", "autocast_dtype": seen[0][3], "model_device": self.device_type,
                "fp32_share": round(share, 3), "layers": [n for n, _, _ in fp32[:MAX_NAMES]],
                "layers_checked": len(seen), "step": self.autocast_step,
            }, step=self.autocast_step)

    def forward_post(self, module: Any, args: Any, kwargs: Any, output: Any) -> None:
        if not self.post_due or self.rerunning:
            return
        self.post_due = False
        g = self.guard
        if g._disabled or thisprocess.pid != g._pid:
            return
        if self.autocast_hooks:
            try:
                self._autocast_post()
            except Exception as exc:
                self.failed(AutocastRunsFp32.name, exc)
        step = g.step_count + 1
        if module.training and self.sampled(step) and LossBroadcastsBatch.name not in self.off:
            out = _first_tensor(output)
            # (B,) or (B, 1) only: the shapes the broadcast bug needs, and small enough to hold on to
            if out is not None and out.requires_grad and (out.dim() == 1 or out.dim() == 2 and out.shape[1] == 1):
                # kept for this micro-batch's `guard.step` (which counts it as micro + 1)
                self.last_output, self.last_output_step = out.detach(), g.micro + 1
                g._output_kept = True  # (guard.step asks this one attribute, not the checks, every micro-batch)
        if g.fast_forward.active and not module.training and self.det_checks < 2 and EvalNotDeterministic.name not in self.off:
            if not self.grad_enabled():
                self.det_checks += 1
                try:
                    self._rerun(module, args, kwargs, output)
                except Exception as exc:
                    self.failed(EvalNotDeterministic.name, exc)

    def _rerun(self, module: Any, args: Any, kwargs: Any, output: Any) -> None:
        """Preflight only: the same evaluation batch through the model a second time must give the same
        output (a sync, once or twice per preflight)."""
        self.rerunning = True
        try:
            again = module(*args, **kwargs)
        finally:
            self.rerunning = False
        diff = _first_difference(_tensors(output), _tensors(again))
        if diff is not None:
            self.report(EvalNotDeterministic.name, {"model": type(module).__name__, **diff})

    # ------------------------------------------------------------------------------------------------
    # the loss: a (B, 1) output against a (B,) target broadcasts to (B, B)

    def on_loss(self, loss: Any) -> None:
        """Called by `guard.step` with the micro-batch's loss (training thread)."""
        micro = self.guard.micro  # already counted by guard.step
        out = self.last_output
        if GATE.capturing:
            return  # (its pinned copy would invalidate a CUDA graph capture: probe/capturegate.py)
        if out is None or self.last_output_step != micro or self.loss_step == micro:
            if out is None or self.last_output_step < micro:  # (kept for a micro-batch that passed)
                self.last_output = None
                self.guard._output_kept = False
            return
        self.loss_step = micro
        self.last_output = None
        self.guard._output_kept = False
        step = self.guard.step_count
        if LossBroadcastsBatch.name in self.off or LossBroadcastsBatch.name in self.sent:
            return
        try:
            self._loss_broadcast(loss, out, step)
        except Exception as exc:
            self.failed(LossBroadcastsBatch.name, exc)

    def _loss_broadcast(self, loss: Any, out: Any, step: int) -> None:
        import torch

        if not (hasattr(loss, "detach") and loss.numel() == 1) or not self.guard._ring.items:
            return
        micro, batch, _ = self.guard._ring.items[-1]
        if micro != self.guard.micro:
            return  # the batch did not come through guard.batches just before this loss
        target = None
        for t in _tensors(batch, limit=8):
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
        accum = self.guard.grad_accum

        def then(values: list[float], item: _Launched) -> None:
            loss_v, *pairs = values
            for kind, (bc, al) in zip(("mse", "l1", "sum of squares"), zip(pairs[0::2], pairs[1::2])):
                for scale in {1.0, 1.0 / accum}:
                    if _close(loss_v, bc * scale) and not _close(loss_v, al * scale, tol=1e-2):
                        self.report(LossBroadcastsBatch.name, {
                            **shapes, "loss": loss_v, "loss_kind": kind, "loss_without_broadcast": al * scale,
                        }, step=item.step)
                        return

        self.launch(step, vec, then)


# ----------------------------------------------------------------------------------------------------
# plain helpers


def _accumulates(param: Any) -> bool:
    """Whether the backward pass under way adds to `param.grad`: a `backward()` does, while
    `torch.autograd.grad(..., inputs=[param])`, which runs the parameter's tensor hooks too, does not.
    (Asked only when the gradient was found as the last optimizer step left it.)"""
    import torch

    will_run = getattr(torch._C, "_will_engine_execute_node", None)
    if will_run is None:
        return True  # (torch without it: a backward() is what runs in training loops)
    with torch.enable_grad():
        node = param.view_as(param).grad_fn.next_functions[0][0]  # its AccumulateGrad node
    try:
        return bool(will_run(node))
    except RuntimeError:  # "a leaf node ... while running autograd.grad()": nothing accumulates
        return False


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


def _first_tensor(value: Any) -> Any:
    found = _tensors(value, limit=1)
    return found[0] if found else None


def _tensors(value: Any, limit: int = 8, depth: int = 0) -> list[Any]:
    """The tensors in a model output or a batch (a tensor, tuple, list, dict or dict-like output)."""
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if depth > 3:
        return []
    items: Iterable[Any] = ()
    if isinstance(value, dict):
        items = value.values()
    elif isinstance(value, (list, tuple)):
        items = value
    out: list[Any] = []
    for v in items:
        out.extend(_tensors(v, limit - len(out), depth + 1))
        if len(out) >= limit:
            break
    return out[:limit]


def _first_difference(first: list[Any], second: list[Any], rel: float = 1e-3) -> dict[str, Any] | None:
    """Where two evaluations of the same batch differ by more than numerical noise, or None."""
    import torch

    for i, (a, b) in enumerate(zip(first, second)):
        if a.shape != b.shape:
            return {"output": i, "first_shape": list(a.shape), "second_shape": list(b.shape)}
        if not a.is_floating_point():
            if not torch.equal(a, b):
                idx = int((a != b).reshape(-1).nonzero()[0])
                return {"output": i, "index": idx, "first": a.reshape(-1)[idx].item(),
                        "second": b.reshape(-1)[idx].item(), "differing": int((a != b).sum())}
            continue
        a32, b32 = a.detach().float(), b.detach().float()
        delta = (a32 - b32).abs()
        scale = max(float(a32.abs().max()), 1e-12) if a32.numel() else 1.0
        worst = float(delta.max()) if delta.numel() else 0.0
        if worst > rel * scale:
            idx = int(delta.reshape(-1).argmax())
            return {"output": i, "shape": list(a.shape), "index": idx,
                    "first": round(float(a32.reshape(-1)[idx]), 6), "second": round(float(b32.reshape(-1)[idx]), 6),
                    "max_abs_diff": worst, "differing": int((delta > rel * scale).sum()), "elements": a.numel()}
    return None


def _close(a: float, b: float, tol: float = 1e-4) -> bool:
    return abs(a - b) <= tol * max(abs(a), abs(b), 1e-12)
