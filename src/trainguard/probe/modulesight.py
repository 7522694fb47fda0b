"""The model of a script that never named it: found through torch's global module hooks (issue 31).

    sight = modulesight.start(probe)     # the automatic probe, right after it was made (probe/auto.py)

Under `trainguard run` with no code change, the probe starts at the first optimizer step with that
optimizer and no model, so the forward contracts (probe/contracts.py: evaluation in training mode, training
in eval mode, autocast, a batch without its batch dimension) had nothing to hook. Here a forward pre-hook
common to all modules (`torch.nn.modules.module.register_module_forward_pre_hook`) is put on once and
looks at the modules that run forwards: the outermost module holding a parameter of the stepped optimizer
is the model being trained (a `DistributedDataParallel` wrapper, not the module inside it). The contract
checks then attach to that module exactly as `watch(model, ...)` attaches them, and the global hook comes
off again.

Why the global hook is taken off rather than kept: while any global forward hook exists, every module
call in the process leaves `Module._call_impl`'s fast path (several microseconds a submodule, measured by
`benchmarks/modulesight_cost.py`), so it is paid on every layer of every forward. It stays only for a
short window: until `WINDOW_STEPS` optimizer steps after the probe's first, or until the root is found
and a few more forwards confirmed no larger module holds it; on each call it asks one dictionary whether
it has seen the module already. After that the cost is the one module-level hook `watch()` pays.

Known limits: only the first root found is checked (two separately called halves of a model held by one
optimizer: the first one called); a model that first runs a forward after the window is not found.
Fail-open: an error takes the hook off and is logged once through the probe.
"""

from __future__ import annotations

from typing import Any

from trainguard.contract import EVENT_PROBE
from trainguard.probe import thisprocess

WINDOW_STEPS = 2  # optimizer steps after the probe's first during which forwards are looked at
CONFIRM_FORWARDS = 64  # module calls after the root was found before the hook comes off (a larger root?)


class ModuleSight:
    """The global forward pre-hook of the discovery window, and what it found."""

    def __init__(self, guard: Any, contracts: Any, optimizer: Any) -> None:
        self.guard = guard
        self.contracts = contracts
        self.opt_ids = {id(p) for group in optimizer.param_groups for p in group["params"]}
        self.seen: dict[int, bool] = {}  # id(module) -> judged already (the fast path's one question)
        self.inside: set[int] = set()  # the ids of the root's modules (its submodules are no roots)
        self.root: Any = None
        self.after_root = 0  # module calls seen since the root was found
        self.until = guard.opt_steps + WINDOW_STEPS
        self.handle: Any = None

    def install(self) -> None:
        from torch.nn.modules.module import register_module_forward_pre_hook

        self.handle = register_module_forward_pre_hook(self.pre)

    def close(self) -> None:
        handle, self.handle = self.handle, None
        if handle is not None:
            handle.remove()  # (torch calls the global hooks from a snapshot: safe inside a call)

    def pre(self, module: Any, args: Any) -> None:
        """Every module's forward, while the window is open: one dictionary question for a module seen."""
        try:
            key = id(module)
            if key in self.seen:
                if self.root is not None:
                    self.after_root += 1
                    if self.after_root > CONFIRM_FORWARDS:
                        self.close()
                return None
            g = self.guard
            if g.state.disabled or thisprocess.pid != g.pid or g.opt_steps > self.until:
                self.close()  # (retired, a forked child, or the window passed)
                return None
            self.seen[key] = True
            if key in self.inside or not self._holds_optimized(module):
                return None
            if self.root is not None and not any(m is self.root for m in module.modules()):
                return None  # a second root beside the first (see the module's known limits)
            self._adopt(module, args)
        except Exception as exc:  # the guard never becomes the failure
            self.close()
            self.guard.fail("model found by global module hooks", exc)
        return None

    def _holds_optimized(self, module: Any) -> bool:
        ids = self.opt_ids
        return any(id(p) in ids for p in module.parameters())

    def _adopt(self, module: Any, args: Any) -> None:
        """`module` is the model being trained: the contract checks attach to it, as under `watch()`."""
        replaced = self.root
        self.root = module
        self.inside = {id(m) for m in module.modules()}
        self.after_root = 0
        self.contracts.adopt(module, args)
        self.guard.writer.add_event(EVENT_PROBE, "model-seen", {
            "model": type(module).__name__, "by": "global module hooks", "modules": len(self.inside),
            "parameters": sum(1 for _ in module.parameters()),
            "replaced": type(replaced).__name__ if replaced is not None else None,
        }, step=self.guard.opt_steps)


def start(guard: Any) -> ModuleSight | None:
    """Opens the discovery window for the automatic probe `guard` (None: nothing to find or to check)."""
    contracts = getattr(guard, "contracts", None)
    optimizer = getattr(guard, "optimizer", None)
    if contracts is None or contracts.module is not None or optimizer is None:
        return None
    sight = ModuleSight(guard, contracts, optimizer)
    sight.install()
    contracts.sight = sight  # the checks close the window at its last optimizer step (`Contracts.opt_post`)
    return sight
