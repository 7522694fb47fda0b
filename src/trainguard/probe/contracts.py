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

This module is the hook dispatcher: the hooks on the model and the calls from the guard's optimizer hooks
and `guard.step`, each handing its event to the families of checks that watch it, one module a family:
probe/contract_grads.py (gradients never reset), contract_params.py (what a step updates),
contract_modes.py (train/eval modes), contract_shapes.py (batch dimension, loss broadcast),
contract_autocast.py and contract_replicas.py. They share a small context (probe/contract_context.py),
which the dispatcher is: a new contract touches its family module and its rule class.
Everything here is fail-open: a check that raises is switched off and logged once through the guard.
While a CUDA graph capture is open in the process the hooks return at once (probe/capturegate.py).
"""

from __future__ import annotations

import os
import time
import weakref
from collections.abc import Iterable
from typing import Any

from trainguard.contract import ENV_CONTRACTS
from trainguard.probe import thisprocess, workerrng
from trainguard.probe.capturegate import GATE
from trainguard.probe.contract_autocast import AUTOCAST_SAMPLES, AutocastChecks
from trainguard.probe.contract_context import CheckContext
from trainguard.probe.contract_grads import GradChecks
from trainguard.probe.contract_modes import ModeChecks
from trainguard.probe.contract_params import SCAN_WARMUP, ParamChecks
from trainguard.probe.contract_replicas import ReplicaChecks
from trainguard.probe.contract_shapes import ShapeChecks
from trainguard.probe.eager import compile_checks
from trainguard.rules.contracts import FrozenParamsUpdated, GradsNeverReset, TrainInEvalMode
from trainguard.rules.contracts_data import (
    AutocastRunsFp32,
    BatchDimLost,
    LossBroadcastsBatch,
    ReplicasDiverged,
    WorkersShareRng,
)

_BATCH_DIM = BatchDimLost.name


def attach(guard: Any) -> Contracts | None:
    """The contract checks for this guard's model and optimizer (None when there is nothing to check)."""
    if guard.model is None and guard.optimizer is None or os.environ.get(ENV_CONTRACTS, "1") == "0":
        return None
    try:
        import torch  # noqa: F401  (the checks need torch; without it there is nothing to check)
    except ImportError:
        return None
    return Contracts(guard)


class Contracts(CheckContext):
    """The hooks of the contract checks, each handing its event to the families that watch it."""

    def __deepcopy__(self, memo: dict) -> Contracts:
        return self  # as Guard: a deep-copied model shares the checks its hooks are bound to

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        from trainguard.probe.detached import Detached

        return (Detached, ())  # as Guard: a pickled model's hooks carry no checks

    def __init__(self, guard: Any) -> None:
        import torch

        CheckContext.__init__(self, guard)
        self.handles: list[Any] = []
        # -- the families of checks, each with its own state (probe/contract_*.py)
        self.grads = GradChecks(self, guard.optimizer)
        self.params = ParamChecks(self)
        self.modes = ModeChecks(self)
        self.autocast = AutocastChecks(self)
        self.shapes = ShapeChecks(self)
        self.replicas = ReplicaChecks(self)
        # What the hooks read or call at every forward or step, bound once (no extra lookup on the hot path):
        # the two lists are the families' own, changed in place.
        self.grad_watch = self.grads.watches
        self.autocast_hooks = self.autocast.hooks
        self._batch_dim = self.shapes.batch_dim
        self._train_mode_without_grad = self.modes.train_mode_without_grad
        self._close_mode_window = self.modes.close_window
        self.on_loss = self.shapes.on_loss  # called by `guard.step` for a micro-batch whose output was kept
        # -- what the forward pre-hook keeps between forwards
        self.train_forward_seen = False
        self.eval_init_checked = False
        self.post_due = False  # the forward post-hook has something to do for the forward under way
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
        self._survey(module)
        self.handles.append(module.register_forward_pre_hook(self._forward_pre, with_kwargs=True))
        if args is not None:
            self._forward_pre(module, args, {})

    def _survey(self, model: Any) -> None:
        """The layers the forward checks read: the mode-dependent ones, and the largest (autocast)."""
        self.modes.survey(model)
        self.autocast.survey(model)

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
    # the loader: DataLoader workers that start with the same random state (probe/workerrng.py)

    def loader(self, iterable: Iterable) -> None:
        if WorkersShareRng.name in self.off:
            return
        try:
            workerrng.wrap(iterable, self.workers)
        except Exception as exc:
            self.failed(WorkersShareRng.name, exc)

    # ------------------------------------------------------------------------------------------------
    # the optimizer's step (called from the guard's own step hooks, probe/opthooks.py)

    def opt_pre(self, optimizer: Any) -> None:
        """The optimizer is about to step (called at the end of the guard's pre-hook, probe/opthooks.py)."""
        st = self.state
        if st.disabled or GATE.capturing or thisprocess.pid != st.pid:
            return
        step = st.opt_steps + 1
        pc = self.params
        if not pc.step_compiled and (step <= SCAN_WARMUP or step % (self.every * AUTOCAST_SAMPLES) == 0):
            pc.look_for_compile(optimizer, step)
        for w in self.grad_watch:  # (one)
            if w.ref is None and (w.decided or w.passes != w.start) and w.error is None:
                w.idle = 0  # the usual window: reset before its forward, or seen so by its first backward pass
            else:
                try:
                    self.grads.close_window(step, pc.opt_params)
                except Exception as exc:
                    self.grads.unwatch()
                    self.failed(GradsNeverReset.name, exc)
                break
        try:
            # Every step, cheaply: the sentinels' `requires_grad` and `.grad`, so a freeze mid-run that
            # touches one of them is seen at its first step; the whole scan on a sample of steps. Device
            # work only when the scan finds a frozen parameter with a gradient.
            params = pc.params_of(optimizer)
            if params and not pc.scan_due(step):
                if pc.no_grad_steps:
                    pc.no_grad_steps = []  # a sentinel has a gradient: the step updates something
                return
            if params:
                params = pc.scan(optimizer, step, params)
                self.replicas.choose(step, params)
        except Exception as exc:
            self.failed("optimizer step", exc)

    def opt_post(self, optimizer: Any) -> None:
        """The optimizer stepped (called from the guard's post-hook, after it counted the step)."""
        st = self.state
        if st.disabled or GATE.capturing or thisprocess.pid != st.pid:
            return
        step = st.opt_steps  # the guard's post-hook counted this step before calling
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
        pc = self.params
        if pc.frozen_before:
            try:
                pc.frozen_after(step)
            except Exception as exc:
                self.failed(FrozenParamsUpdated.name, exc)
        if self.world > 1 and self.sampled(step) and ReplicasDiverged.name not in self.off:
            try:
                self.replicas.checksum(step)
            except Exception as exc:
                self.failed(ReplicasDiverged.name, exc)

    # ------------------------------------------------------------------------------------------------
    # the model's forward: train mode in evaluation, evaluation before any training forward, autocast,
    # evaluation determinism (preflight), the output kept for the loss check

    def _forward_pre(self, module: Any, args: Any, kwargs: Any) -> None:
        checks = self._checks
        if checks is not None and (checks[0]() or checks[1]() is not None):
            return self._rerun_disabled(0, module, args, kwargs)
        try:
            st = self.state
            st.ticks += 1  # every forward of the watched model is progress (probe/steps.py: counted, not timed)
            if self.rerunning or st.disabled or GATE.capturing or thisprocess.pid != st.pid:
                self.post_due = False
                return
            training = module.training
            done = st.opt_steps if st.opt_steps > st.loss_steps else st.loss_steps  # the step count, without a call
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
                        self.modes.eval_before_train()
                except Exception as exc:
                    self.failed("train/eval mode", exc)
            step = done + 1
            if training and (step <= 3 or step % self.every == 0):  # a sampled step's training forward
                ac = self.autocast
                if ac.step != step:
                    ac.step = step  # (its first forward only)
                    if ac.due(step):
                        try:
                            ac.pre(step)
                        except Exception as exc:
                            self.failed(AutocastRunsFp32.name, exc)
                # The post-hook keeps the output for the loss check and reads the autocast layers' dtypes.
                self.post_due = True
            else:
                # ... and is not needed, unless the autocast layers' hooks are still on (a sampled forward that
                # raised) or preflight evaluates (its second evaluation)
                self.post_due = bool(self.autocast_hooks) or (not training and self.guard.fast_forward.active)
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

    def forward_post(self, module: Any, args: Any, kwargs: Any, output: Any) -> None:
        if not self.post_due or self.rerunning:
            return
        self.post_due = False
        g = self.guard
        st = self.state
        if st.disabled or thisprocess.pid != st.pid:
            return
        if self.autocast_hooks:
            try:
                self.autocast.post()
            except Exception as exc:
                self.failed(AutocastRunsFp32.name, exc)
        step = g.step_count + 1
        if module.training and self.sampled(step) and LossBroadcastsBatch.name not in self.off:
            self.shapes.keep_output(output)
        if g.fast_forward.active and not module.training:
            self.modes.evaluation_twice(module, args, kwargs, output)
