"""The automatic probe: what `trainguard run` learns from a script that never calls `trainguard.watch`.

    env.update(auto.bootstrap_env())    # the watchdog, for the command it starts

`bootstrap_env` prepends a folder holding only a `sitecustomize.py` to PYTHONPATH. The interpreter
imports that module at start-up in every Python process of the run (the command, its DataLoader
workers, torchrun's ranks, anything they start), and it calls `boot()` here, which:

1. installs the stack dump on a signal (`probe/stackdump.py`): stacks need neither py-spy nor ptrace;
2. puts a finder on `sys.meta_path` that waits for `torch.optim.optimizer` to be imported. A process
   that never imports torch pays one string comparison per import and nothing else. Once torch's
   optimizer module has run, torch's *global* optimizer step hooks are registered;
3. at the first optimizer step of the process, those hooks make an ordinary probe with that optimizer
   (`Probe`, probe/core.py: the guard's parts without its public face): the same hooks, on-device statistics read in batches, store and rules as `watch()`
   (LR of each group, gradient norm, update ratio, non-finite gradients, optimizer step count), then
   remove themselves. A process that never steps an optimizer (a worker, a launcher) gets no probe;
4. over the next forwards, torch's global module hooks find the model that optimizer trains, and the
   forward contracts (evaluation in training mode, training in eval mode, autocast, batch shape) attach to
   it as under `watch(model, ...)` (probe/modulesight.py); the global hook then comes off.

It steps aside when the script has its own guard (`trainguard.watch` before the first step: no probe
is made; after it: this one retires), and is off with `trainguard run --no-auto` or
`TRAINGUARD_AUTO=0`. Fail-open throughout: any error leaves the process as it would have been.
Known limit: only the first optimizer that steps is watched (a GAN's second optimizer is not).
"""

from __future__ import annotations

import os
import sys
import threading

# Only the standard library's lightest modules at import: the bootstrap loads this file (and
# probe/stackdump.py) into every Python process of the run at start-up, without importing the trainguard
# package, so a process that never imports torch pays microseconds, not the package's imports.
TYPE_CHECKING = False  # as in contract.py: true for type checkers only, so `typing` is never imported here
if TYPE_CHECKING:
    from typing import Any

# (the contract imports nothing; the bootstrap loads it before this file, see boot/sitecustomize.py)
from trainguard.contract import ENV_AUTO, ENV_DISABLE, ENV_PREFLIGHT, ENV_RUN_DIR, ENV_STACKS  # noqa: E402

BOOT_DIR = os.path.join(os.path.dirname(os.path.realpath(__file__)), "boot")  # sitecustomize.py, nothing else
OPTIMIZER_MODULE = "torch.optim.optimizer"

_state: dict[str, Any] = {"booted": False, "handles": [], "guard": None, "aside": False, "pid": None}
_lock = threading.Lock()


def enabled(environ: Any = None) -> bool:
    env = os.environ if environ is None else environ
    return env.get(ENV_AUTO, "1") != "0" and not env.get(ENV_DISABLE)


def bootstrap_env(environ: Any = None) -> dict[str, str]:
    """The environment entries that load the bootstrap into every Python process of a command."""
    env = os.environ if environ is None else environ
    if not enabled(env):
        return {ENV_AUTO: "0"}
    path = [BOOT_DIR] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != BOOT_DIR]
    return {"PYTHONPATH": os.pathsep.join(path), ENV_AUTO: "1"}


# -- at interpreter start-up (from sitecustomize) ---------------------------------------------------


def boot() -> None:
    """Called by the bootstrap's sitecustomize in every Python process of a watched command."""
    if _state["booted"] or not enabled() or not os.environ.get(ENV_RUN_DIR):
        return
    _state["booted"] = True
    _install_stack_dump()
    after_import = {OPTIMIZER_MODULE: _on_optimizer_module}
    if os.environ.get(ENV_PREFLIGHT):
        # preflight: the write watch before the script's first line, and on torch.save / safetensors as
        # soon as they exist (they write from native code, unseen by the audit hook)
        _install_write_watch()
        after_import.update({"torch.serialization": _wrap_savers, "safetensors.torch": _wrap_savers})
    for name in [n for n in after_import if n in sys.modules]:
        after_import.pop(name)(sys.modules[name])
    if after_import:
        sys.meta_path.insert(0, _AfterImport(after_import))


def _install_stack_dump() -> None:
    stackdump = sys.modules.get("trainguard.probe.stackdump")
    if stackdump is None:
        from trainguard.probe import stackdump
    if not os.environ.get(ENV_STACKS):
        # the first Python process of the run: its children inherit the folder through the environment
        folder = os.path.join(os.environ[ENV_RUN_DIR], "stacks")
        try:
            os.makedirs(folder, exist_ok=True)
        except OSError:
            return
        os.environ[ENV_STACKS] = os.path.realpath(folder)
    assert stackdump is not None  # found loaded, or imported just above
    stackdump.install_from_env()


class _AfterImport:
    """Finds nothing itself: when a watched module is about to load, wraps its loader so that a callback
    runs right after the module ran; leaves `sys.meta_path` once every watched module was seen."""

    def __init__(self, callbacks: dict[str, Any]) -> None:
        self.callbacks = callbacks

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name not in self.callbacks:
            return None
        try:
            callback = self.callbacks.pop(name)
            if not self.callbacks:
                sys.meta_path.remove(self)
            spec = None
            for finder in sys.meta_path:
                find = getattr(finder, "find_spec", None)
                if finder is not self and find is not None and (spec := find(name, path, target)) is not None:
                    break
            loader = getattr(spec, "loader", None)
            if loader is None or not hasattr(loader, "exec_module"):
                return spec
            original = loader.exec_module

            def exec_module(module: Any) -> None:
                original(module)
                callback(module)

            loader.exec_module = exec_module
            return spec
        except Exception:
            return None  # the ordinary finders take over: the module loads as if we were not here


def _install_write_watch() -> None:
    try:
        import json

        from trainguard.probe import scratchwrites

        cfg = json.loads(os.environ[ENV_PREFLIGHT])
        if cfg.get("scratch"):
            from pathlib import Path

            scratchwrites.install_write_watch(Path(cfg["scratch"]), Path(os.environ[ENV_RUN_DIR]),
                                              cfg.get("origin"))
    except Exception as exc:
        _note(f"preflight write watch not installed at start-up: {exc!r}")


def _wrap_savers(module: Any) -> None:
    try:
        from trainguard.probe import scratchwrites

        scratchwrites.wrap_savers()
    except Exception as exc:
        _note(f"preflight: torch.save / save_file not wrapped: {exc!r}")


def _on_optimizer_module(module: Any) -> None:
    try:
        pre = getattr(module, "register_optimizer_step_pre_hook", None)
        post = getattr(module, "register_optimizer_step_post_hook", None)
        if pre is None or post is None:
            return  # torch < 2.0: no global hooks, no automatic probe (stacks on a signal still work)
        _state["handles"] = [pre(_first_step)]
        post(_after_first_step)
        _state["pid"] = os.getpid()
    except Exception:
        pass


# -- at the first optimizer step ---------------------------------------------------------------------


def _first_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    """Global pre-hook: makes the probe for the first optimizer that steps (or steps aside), once."""
    if _state["guard"] is not None or _state["aside"] or _capturing_here():
        return  # (an optimizer step captured into a CUDA graph is not taken: the probe starts at an eager one)
    with _lock:
        if _state["guard"] is not None or _state["aside"]:
            return
        try:
            if os.getpid() != _state["pid"] or _watch_guard_exists() or not enabled():
                _step_aside()  # a forked child, or the script has trainguard.watch
                return
            from trainguard.probe.core import Probe

            # preflight only: the scheduler of this optimizer, so the fast-forward can watch how it is
            # stepped and simulate it (a heap search, once: too slow to pay on every run)
            scheduler = find_scheduler(optimizer) if os.environ.get(ENV_PREFLIGHT) else None
            # The guard registers its own hooks on this optimizer; torch has not begun the optimizer's
            # own hook list yet, so they run for this very step.
            guard = Probe(None, optimizer, scheduler, auto=True)  # the guard's parts, without its public face
            _state["guard"] = guard
            _look_for_model(guard)
            import atexit

            atexit.register(_finish_at_exit, guard)  # after the guard's own: atexit runs last-in first
        except Exception as exc:
            _state["aside"] = True
            _note(f"automatic probe not started: {type(exc).__name__}: {exc}")


def _look_for_model(guard: Any) -> None:
    """The model the optimizer trains, found by torch's global module hooks over the next forwards, gets
    the forward contract checks `watch(model, ...)` gives it (probe/modulesight.py). Fail-open."""
    try:
        from trainguard.probe import modulesight

        modulesight.start(guard)
    except Exception as exc:
        guard.fail("model found by global module hooks", exc)


def _capturing_here() -> bool:
    """Whether this thread captures a CUDA graph now (asked only until the probe exists; no CUDA call
    where CUDA was never initialised)."""
    cuda = getattr(sys.modules.get("torch"), "cuda", None)
    try:
        return bool(cuda is not None and cuda.is_initialized() and cuda.is_current_stream_capturing())
    except Exception:
        return False


def _after_first_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    """Global post-hook: removes the pre-hook once its work is done. (Not from the pre-hook itself: torch
    is iterating over the pre-hooks then, and a hook list changed under iteration raises.) It stays
    registered itself, as a call that returns at once."""
    if (_state["guard"] is not None or _state["aside"]) and _state["handles"]:
        pre = _state["handles"].pop(0)
        try:
            pre.remove()
        except Exception:
            pass


def _step_aside() -> None:
    _state["aside"] = True


def find_scheduler(optimizer: Any) -> Any:
    """The LR scheduler that steps `optimizer` (the outermost one: a SequentialLR, not its parts), or None.

    Schedulers hold their optimizer, the optimizer does not know them: they are found among the objects
    that refer to it (directly, or through their instance dict).
    """
    import gc

    try:
        from torch.optim.lr_scheduler import LRScheduler
    except ImportError:
        return None
    found: list[LRScheduler] = []
    for ref in gc.get_referrers(optimizer):
        for obj in [ref] if not isinstance(ref, dict) else gc.get_referrers(ref):
            if isinstance(obj, LRScheduler) and getattr(obj, "optimizer", None) is optimizer \
                    and not any(obj is f for f in found):
                found.append(obj)
    inner = {id(s) for f in found for s in getattr(f, "_schedulers", [])}
    outer = [f for f in found if id(f) not in inner]
    return outer[0] if len(outer) == 1 else None  # two unrelated schedulers: which one steps it is unknown


def _watch_guard_exists() -> bool:
    mod = sys.modules.get("trainguard.probe.crashhook")  # not imported here: loaded with the guard, if at all
    return bool(mod is not None and mod.watched_by_script())


def _finish_at_exit(guard: Any) -> None:
    """The script has no `guard.finish()`: reaching interpreter exit without a crash is its end."""
    if not guard.crashed and not _state["aside"]:
        guard.finish()


def retire() -> None:
    """`trainguard.watch` was called: the script's own guard takes over from the automatic one."""
    _step_aside()
    guard = _state["guard"]
    if guard is None:
        return
    try:
        guard.retire()
    except Exception as exc:
        _note(f"automatic probe not retired cleanly: {exc!r}")


def _note(text: str) -> None:
    try:
        from trainguard.store.selflog import GuardLog

        GuardLog(os.environ[ENV_RUN_DIR], int(os.environ.get("RANK", "0") or 0)).write(text)
    except Exception:
        pass
