"""Gradients never reset between optimizer steps (grads-never-reset): the gradient of one parameter
followed from each optimizer step to the next.

One tensor hook on the largest trainable parameter, taken out of the parameter's hook dictionary as soon
as the window's reset is seen (by the forward pre-hook when `zero_grad()` comes before the forward, else
by the first backward pass): in the usual loop no call or one from backward a step, and no device work.
The dispatcher (probe/contracts.py) runs the watch's fast paths inline (the window's first forward, the
usual step); `GradChecks` judges a window that was not the usual one and exchanges a watched parameter
that backward passes stopped reaching.
"""

from __future__ import annotations

from typing import Any

from trainguard.probe.capturegate import GATE
from trainguard.probe.contract_context import CheckContext
from trainguard.rules.contracts import GradsNeverReset

REWATCH_IDLE = 50  # windows without a backward pass into the watched parameter: look for another at 2, 52, ...


class GradWatch:
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


class GradChecks:
    """grads-never-reset: the watched parameter's windows, judged at each optimizer step."""

    def __init__(self, ctx: CheckContext, opt: Any) -> None:
        self.ctx = ctx
        # The watches (one). The same list is the dispatcher's `grad_watch`, read by its hooks: it is changed
        # in place, never replaced.
        self.watches: list[GradWatch] = []
        if opt is not None:
            # (the optimizer's side, `opt_pre` and `opt_post`, is called from the guard's own step hooks,
            # probe/opthooks.py: one pair of hooks and compile checks a step for the whole probe)
            self.watch_grads(opt)

    def watch_grads(self, opt: Any) -> None:
        """Follows the gradient of one parameter, the largest trainable one, through the backward passes
        between optimizer steps (`GradWatch`): no device work; a tensor hook called by backward passes
        only until the window's reset is seen, by the forward pre-hook or the first pass (each call takes
        the interpreter lock back in the middle of a backward pass, on the autograd engine's thread on a
        GPU). A parameter that backward passes stop reaching (frozen, unused) is exchanged for another
        (`rewatch`)."""
        params = [p for g in opt.param_groups for p in g["params"] if p.requires_grad]
        if params:
            self.watch(max(params, key=lambda p: p.numel()))

    def watch(self, p: Any) -> None:
        watch = GradWatch(self.ctx.name(p, "param_groups[..]"), p)
        watch.install()
        self.watches.append(watch)

    def unwatch(self) -> None:
        """The gradient hooks come off (the contract reported, or its check switched off)."""
        for w in self.watches:
            w.remove()
        del self.watches[:]

    def close_window(self, step: int, opt_params: list[tuple[int, Any]]) -> None:
        """The window that ended at this optimizer step, when it was not the usual one (reset before its
        forward or by its first backward pass). `opt_params`: the optimizer's parameters as last scanned."""
        for w in list(self.watches):
            if w.error is not None:
                raise w.error
            if w.passes == w.start and not w.decided:  # no backward pass reached it since the last step
                w.idle += 1
                if w.idle % REWATCH_IDLE == 2:
                    self.rewatch(w, opt_params)
                continue
            w.idle = 0
            if w.ref is None:
                continue  # reset in this window (or no step before it to compare with)
            # Not a streak: `zero_grad()` every other step (a misplaced `if`) leaves every second window
            # without a reset, and is as wrong.
            w.windows.append(step)
            if len(w.windows) >= 2:
                self.ctx.report(GradsNeverReset.name, {
                    "param": w.name, "steps": w.windows[:10], "backward_passes": w.passes - w.reset_at,
                    "grad_accum": self.ctx.guard.grad_accum,
                }, step=w.windows[0])
                self.unwatch()  # one event per run: nothing more to follow
                return

    def rewatch(self, w: GradWatch, opt_params: list[tuple[int, Any]]) -> None:
        """Two windows in a row without a backward pass into the watched parameter: if it is frozen or has
        no gradient, the largest trainable parameter that has one is watched instead."""
        p = w.param
        if p.requires_grad and p.grad is not None:
            return  # (its backward passes run inside the step: an LBFGS closure)
        others = [q for _, q in opt_params if q is not p and q.requires_grad and q.grad is not None]
        if others:
            w.remove()
            self.watches.remove(w)
            self.watch(max(others, key=lambda q: q.numel()))


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
