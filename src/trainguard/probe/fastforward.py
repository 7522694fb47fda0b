"""Fast-forward: the probe's side of `trainguard preflight`.

When TRAINGUARD_PREFLIGHT is set (by `trainguard preflight`, never by hand), the guard consults a
`FastForward` at four places, and the user's unmodified script is driven through its rare paths in
seconds:

- `due(name, every)`: after `steps` real optimizer steps, every name answers True once, early, so the
  eval, save and other gated paths run with the real step counter and the real dtype/autocast state;
- `batches(loader)`: the first training pass over a loader ends at that point, so the script crosses
  its epoch boundary and iterates the loader again (with its real num_workers);
- the optimizer pre-hook: at step `steps` the LR schedule is simulated for the whole plan on a deep copy
  of the scheduler taken when `watch()` was called (its optimizer's parameters replaced by tiny stand-ins);
- `step()`: once every path had its turn, the guard finishes itself and ends the script with a clean
  exit 0 (`PreflightStop`, a SystemExit).

In "resume" mode (the second, brief start, with TRAINGUARD_RESUME_FROM set) nothing is brought forward:
the script resumes from the preflight's checkpoint, makes `steps` optimizer steps and is stopped.

Writes: a Python audit hook watches files opened for writing (and `torch.save`/safetensors' `save_file`,
which open their files in native code, are wrapped to do the same). A write into the scratch folder
through one of its symlinks to the user's files first replaces the symlink by a private copy (copy on
write), so the preflight never alters the user's files; a change to a file elsewhere that existed
before is refused (PermissionError), a new file elsewhere is listed in `outside-writes.txt` of the run
folder, for the preflight's report (probe/scratchwrites.py). Under `trainguard preflight` the bootstrap
(probe/auto.py) installs this watch at interpreter start-up, before the script's first line. Other native writers are not seen
here: the preflight compares the user's folder before and after instead (after the fact).

Everything here is bounded and fail-open like the rest of the probe: an error is logged to guard.log and
the fast-forward steps aside (the script then simply runs on).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from trainguard.contract import ENV_PREFLIGHT, ENV_RESUME_FROM, EVENT_PREFLIGHT
from trainguard.folderio import write_atomic
from trainguard.probe import planinfo
from trainguard.probe.lockstep import Lockstep
from trainguard.probe.scratchwrites import install_write_watch

SETTLE_STEPS = 2  # optimizer steps after the last newly brought-forward path before the script is stopped
MAX_PATHS = 32  # names brought forward at most (a name built from the step would otherwise never settle)
SCHEDULE_FILE = "schedule.json"


class PreflightStop(SystemExit):
    """Ends the script cleanly once the fast-forward is done (exit code 0, `finally` blocks run)."""

    def __init__(self) -> None:
        super().__init__(0)


class NoFastForward:
    """The mode of every run that is not a preflight: the guard's calls do nothing (no method of the guard
    asks "am I in preflight?"; it calls its mode, and this one has nothing to do)."""

    active = False

    def due(self, name: str, every: int) -> bool:
        return False

    def batches(self, iterable: Iterable) -> Iterable:
        return iterable

    def before_opt_step(self) -> None:
        pass

    def after_step(self) -> None:
        pass

    def note_resume_read(self) -> None:
        pass


NO_FAST_FORWARD = NoFastForward()


def from_env(guard: Any, writer: Any, log: Any) -> FastForward | NoFastForward:
    """The guard's mode, chosen once at its start: a FastForward under `trainguard preflight`, else the
    do-nothing default. `guard` is read through its public face; `writer` takes the events, `log` a line
    for guard.log."""
    raw = os.environ.get(ENV_PREFLIGHT)
    if not raw:
        return NO_FAST_FORWARD
    try:
        cfg = json.loads(raw)
        return FastForward(guard, writer, log, mode=cfg.get("mode", "first"), steps=int(cfg.get("steps", 3)),
                           scratch=cfg.get("scratch"), origin=cfg.get("origin"))
    except Exception as exc:  # a broken preflight setup must not break the script
        guard.fail("preflight setup", exc)
        return NO_FAST_FORWARD


class FastForward:
    """Preflight's mode: brings `due()` paths forward, ends the first epoch early, stops the script."""

    active = True

    def __init__(self, guard: Any, writer: Any, log: Any, *, mode: str, steps: int, scratch: str | None,
                 origin: str | None = None) -> None:
        self.guard = guard
        self._writer = writer
        self.mode = mode
        self.steps = max(1, steps)
        self.forced: dict[str, int] = {}  # due name -> step it was brought forward to
        self.seen: dict[str, int] = {}  # due name -> its `every`
        self.last_new = 0  # step of the last newly forced path
        self.open_path: tuple[str, float] | None = None
        self.cut: dict[str, Any] | None = None  # the training pass that was ended early
        self.reiterated = False  # the loader was iterated again after the cut, and yielded
        self.used_batches = False
        self.stopping = False
        # optimizer step -> scheduler.last_epoch at its pre-hook (a scheduler), or the LR (none: _watch_hand_lr)
        self.lrs_seen: dict[int, float] = {}
        self._sched_copy = _schedule_snapshot(guard)
        # every rank of a torchrun job fast-forwards; rank 0 decides, the others follow (probe/lockstep.py)
        self.lockstep = Lockstep.for_process(guard.rank, _world_size(), log=log)
        self._event("start", {"mode": mode, "steps": self.steps,
                                     "scheduler_copied": self._sched_copy is not None})
        if scratch:
            install_write_watch(Path(scratch), guard.run_dir, origin)

    # -- the guard's calls ----------------------------------------------------------------------------

    def due(self, name: str, every: int) -> bool:
        """True when `name` is brought forward now (once, at or after `steps` real steps)."""
        self._close_path()
        if name not in self.seen:
            self.seen[name] = every
            self._event("due-seen", {"name": name, "every": every})
        step = self.guard.step_count
        local = not (self.mode != "first" or every <= 0 or name in self.forced or len(self.forced) >= MAX_PATHS
                     or step < self.steps
                     or not self._at_boundary())  # every <= 0: the path is switched off, as in the real run
        if self.mode != "first" or not self.lockstep.decide(f"due/{name}/{step}/{self.guard.micro}", local):
            return False
        self.forced[name] = step
        self.last_new = step
        self._event("forced", {"name": name, "every": every, "step": step})
        self.open_path = (name, time.perf_counter())
        return True

    def batches(self, iterable: Iterable) -> Iterator:
        """Yields from `iterable`; ends the first training pass early; notes the re-iteration."""
        self.used_batches = True
        again = self.cut is not None and not self.reiterated and _same_loader(self.cut, iterable)
        if again:
            self._event("reiterate-begin", {"step": self.guard.step_count})
        start = self.guard.step_count
        items = 0
        iterator = iter(iterable)  # a loader that fails when iterated again fails here, as it would
        while True:
            self._close_path()
            self.maybe_stop()
            trains = self.guard.step_count > start  # this pass makes optimizer steps: a training pass
            if (self.mode == "first" and self.cut is None and trains
                    and self.lockstep.decide(f"cut/{self.guard.step_count}/{self.guard.micro}",
                                             self.guard.step_count >= self.steps and self._at_boundary())):
                self.cut = {"id": id(iterable), "type": type(iterable).__name__, "len": _len(iterable),
                            "step": self.guard.step_count, "items": items}
                self._event("epoch-cut", self.cut)
                return
            try:
                item = next(iterator)
            except StopIteration:
                if trains and self.cut is None:
                    self._event("epoch-end", {"step": self.guard.step_count, "items": items,
                                                     "len": _len(iterable)})
                    self.cut = {"id": id(iterable), "type": type(iterable).__name__, "len": _len(iterable),
                                "step": self.guard.step_count, "items": items, "natural": True}
                return
            items += 1
            if again and items == 1:
                self.reiterated = True
                self._event("reiterate-ok", {"step": self.guard.step_count})
            yield item

    def before_opt_step(self) -> None:
        """Optimizer pre-hook: watch how the scheduler is stepped; simulate the plan at step `steps`."""
        if self.mode != "first":
            return
        k = self.guard.opt_steps + 1
        if self.guard.scheduler is None or planinfo.is_timm(self.guard.scheduler):
            self._watch_hand_lr(k)
            return
        epoch = planinfo.sched_epoch(self.guard.scheduler) if self._sched_copy is not None else None
        if epoch is not None and len(self.lrs_seen) < 64:
            self.lrs_seen[k] = epoch
        if k != max(2, self.steps):
            return
        if 1 in self.lrs_seen and k in self.lrs_seen:
            ratio = (self.lrs_seen[k] - self.lrs_seen[1]) / (k - 1)
            self._simulate(ratio)
        else:  # the output must say the schedule went unchecked, not stay silent about it
            why = ("it could not be copied (see guard.log)" if self._sched_copy is None else
                   "it keeps no step count (last_epoch) to measure how the script steps it")
            self._unchecked({"scheduler": type(self.guard.scheduler).__name__,
                                    "skipped": f"the scheduler {type(self.guard.scheduler).__name__} was not simulated:"
                                               f" {why}; the LR schedule was not checked"})

    def after_step(self) -> None:
        """A step closed: stop the script when the fast-forward is done (PreflightStop propagates)."""
        try:
            self._close_path()
            if self.stopping or not self._at_boundary():
                return
        except Exception as exc:
            self.guard.fail("preflight step", exc)
            return
        self.maybe_stop()

    def note_resume_read(self) -> None:
        if self.mode == "resume":
            self._event("resume-read", {"path": os.environ.get(ENV_RESUME_FROM)})

    # -- stopping -----------------------------------------------------------------------------------

    def done(self) -> bool:
        step = self.guard.step_count
        if self.mode != "first":
            return step >= self.steps
        if step < self.steps + SETTLE_STEPS or step < self.last_new + SETTLE_STEPS:
            return False
        # a loop over guard.batches must also have crossed its epoch boundary first
        return not self.used_batches or self.reiterated or bool(self.cut and self.cut.get("natural"))

    def maybe_stop(self) -> None:
        if self.stopping or not self._at_boundary():
            return
        # one stop for every rank: rank 0 announces it a step ahead (probe/lockstep.py)
        stop = self.lockstep.stop_step(self.guard.step_count, self.done())
        if stop is None or self.guard.step_count < stop:
            return
        self.stopping = True
        self._event("stop", {"step": self.guard.step_count, "forced": self.forced,
                                    "cuda_peak_bytes": _cuda_peak()})
        self.guard.finish()
        self.lockstep.all_stopped()  # no rank leaves while another may still be in the last step's collectives
        raise PreflightStop()

    # -- helpers ------------------------------------------------------------------------------------

    def _at_boundary(self) -> bool:
        """Only between optimizer steps: never in the middle of a gradient-accumulation window."""
        return self.guard.at_boundary()

    def _close_path(self) -> None:
        if self.open_path is None:
            return
        name, t0 = self.open_path
        self.open_path = None
        self._event("path-time", {"name": name, "seconds": time.perf_counter() - t0})

    def _event(self, name: str, data: dict[str, Any]) -> None:
        try:
            self._writer.add_event(EVENT_PREFLIGHT, name, data, step=self.guard.step_count)
        except Exception as exc:
            self.guard.fail("preflight event", exc)

    def _simulate(self, ratio: float) -> None:
        try:
            from trainguard.probe.schedsim import simulate

            snapshot = self._sched_copy
            if snapshot is None:  # (not reached: the epochs simulated from were read from the snapshot)
                return
            offset = int(self.lrs_seen[1]) - snapshot[1]  # scheduler epochs: ints (int() only tells mypy)
            total, assumed = self.guard.total_steps, None
            if total is None and getattr(self.guard, "auto", False):
                # a script without trainguard.watch states no plan: the scheduler's own horizon stands for
                # it, on the assumption (said in the result) that it was sized in optimizer steps
                from trainguard.probe.planinfo import sched_horizon

                total = sched_horizon(self.guard.scheduler)
                assumed = "the scheduler's own horizon (no trainguard.watch(total_steps=...))" if total else None
            result = simulate(snapshot[0], ratio=ratio, offset=offset, total_steps=total,
                              grad_accum=self.guard.grad_accum)
            if assumed:
                result["total_steps_from"] = assumed
            result["scheduler"] = type(self.guard.scheduler).__name__
            if self.guard.rank == 0:  # every rank simulates the same schedule: one writes it
                write_atomic(Path(self.guard.run_dir) / SCHEDULE_FILE, json.dumps(result))  # never via a link
            self._event("schedule", {k: v for k, v in result.items() if k != "curve"})
        except Exception as exc:
            self.guard.fail("preflight schedule simulation", exc)


    def _watch_hand_lr(self, k: int) -> None:
        """No scheduler: the LR of the first steps, then the script's own LR function found and simulated.

        nanoGPT sets `param_groups[i]["lr"] = get_lr(iter_num)` before each step. A module-level function
        of the script whose name says LR and that reproduces the LRs of the first steps exactly is that
        function: it is called for every planned step. timm's schedulers are read the same way: stepped with
        `step_update(num_updates)`, their LR at update t is `_get_lr(t)`, checked against the first steps.
        Otherwise schedule.json says why nothing was checked.
        """
        groups = self.guard.optimizer.param_groups if self.guard.optimizer is not None else []
        lr = groups[0].get("lr") if groups else None
        if isinstance(lr, (int, float)) and len(self.lrs_seen) < 64:
            self.lrs_seen[k] = float(lr)
        if k != max(HAND_LR_STEPS, self.steps) or len(self.lrs_seen) < HAND_LR_STEPS:
            return
        try:
            from trainguard.probe.schedsim import simulate_function

            seen = [self.lrs_seen[i] for i in sorted(self.lrs_seen)]
            sched = self.guard.scheduler
            found: tuple[Any, int] | None  # (the LR function, its step shift)
            if sched is not None:  # timm: stepped per update, its LR at update t is `_get_lr(t)`
                name = f"{type(sched).__name__}._get_lr"
                copy = self._sched_copy[0] if self._sched_copy is not None else sched
                fn = (lambda t: copy._get_lr(t)[0]) if not getattr(sched, "t_in_epochs", True) else None
                shift = _shift_matching(fn, self.lrs_seen) if fn is not None else None
                found = (fn, shift) if shift is not None else None
            else:
                found = find_lr_function(sys.modules.get("__main__"), self.lrs_seen)
                name = found[0].__name__ if found else ""
            if found is not None:
                fn, shift = found
                result = simulate_function(fn, shift=shift, total_steps=self.guard.total_steps,
                                           grad_accum=self.guard.grad_accum, name=name)
                if sched is not None:  # a timm scheduler, simulated through its own formula: not "by hand"
                    result.update(scheduler=type(sched).__name__, function=None, timm=True)
            elif sched is not None:
                result = {"scheduler": type(sched).__name__, "total_steps": self.guard.total_steps, "skipped": (
                    f"the timm scheduler {type(sched).__name__} counts epochs (t_in_epochs=True): it was not"
                    " simulated per optimizer step; the LR schedule was not checked"
                    if getattr(sched, "t_in_epochs", True) else
                    f"the timm scheduler {type(sched).__name__} did not reproduce the LRs of the first steps"
                    " (is step_update() called once per optimizer step?); the LR schedule was not checked")}
            else:
                varied = max(seen) - min(seen) > 1e-12 * max(abs(v) for v in seen)
                result = {"scheduler": None, "total_steps": self.guard.total_steps, "grad_accum": self.guard.grad_accum,
                          "first_lrs": seen[:8], "set_by_hand": varied}
                result["skipped"] = (
                    f"the LR is set by hand (it changed over the first {len(seen)} steps: "
                    f"{', '.join(f'{v:.3g}' for v in seen[:4])}) and no function of the script reproduces it:"
                    " the LR schedule was not checked" if varied else
                    f"no scheduler was passed to trainguard.watch() and the LR stayed at {seen[0]:.3g} over the"
                    f" first {len(seen)} steps: the LR schedule was not checked (pass the scheduler to watch())")
            self._unchecked(result)
        except Exception as exc:
            self.guard.fail("preflight schedule simulation", exc)

    def _unchecked(self, result: dict[str, Any]) -> None:
        """Writes a schedule result (simulated, or why not) where the preflight reads it."""
        try:
            if self.guard.rank == 0:  # every rank finds the same: one writes it
                write_atomic(Path(self.guard.run_dir) / SCHEDULE_FILE, json.dumps(result))  # never via a link
            self._event("schedule", {k: v for k, v in result.items() if k != "curve"})
        except Exception as exc:
            self.guard.fail("preflight schedule result", exc)


def _shift_matching(fn: Any, seen: dict[int, float]) -> int | None:
    """The shift s for which fn(k + s) is the LR seen at every optimizer step k, if any."""
    for shift in (-1, 0, 1):
        try:
            if all(abs(float(fn(k + shift)) - v) <= 1e-9 * max(1.0, abs(v)) for k, v in seen.items()):
                return shift
        except Exception:
            continue  # not callable with this step number
    return None


HAND_LR_STEPS = 3  # LRs of real steps a hand-written LR function must reproduce before it is trusted
LR_WORDS = ("lr", "learning_rate")


def find_lr_function(module: Any, seen: dict[int, float]) -> tuple[Any, int] | None:
    """A function of `module` (the script) named for the LR whose value at step k + shift is the LR seen
    at optimizer step k, for every step seen (shift -1: it counts from 0, like nanoGPT's iter_num)."""
    import inspect

    if module is None or not seen:
        return None
    for name, fn in list(vars(module).items()):
        if not inspect.isfunction(fn) or getattr(fn, "__module__", None) != module.__name__:
            continue
        if not any(w in name.lower() for w in LR_WORDS):
            continue
        try:
            params = list(inspect.signature(fn).parameters.values())
        except (TypeError, ValueError):
            continue
        positional = [q for q in params if q.kind in (q.POSITIONAL_ONLY, q.POSITIONAL_OR_KEYWORD)]
        required = [q for q in params if q.default is q.empty and q.kind not in (q.VAR_POSITIONAL, q.VAR_KEYWORD)]
        if not positional or len(required) > 1:
            continue
        shift = _shift_matching(fn, seen)
        if shift is not None:
            return fn, shift
    return None


def _schedule_snapshot(guard: Any) -> tuple[Any, int] | None:
    """A deep copy of the scheduler as `watch()` found it, its optimizer's parameters replaced by stand-ins.

    Why stand-ins: copying the real parameters would double the model's memory; the schedule needs only
    the param groups' hyperparameters. Taken before the guard's optimizer hooks exist, so the copy does
    not drag the guard along.
    """
    sched = guard.scheduler
    if sched is None or guard.optimizer is None:
        return None
    try:
        import copy

        import torch

        memo: dict[int, Any] = {id(guard): guard}
        for group in guard.optimizer.param_groups:
            for p in group["params"]:
                memo[id(p)] = torch.zeros(1)
        return copy.deepcopy(sched, memo), planinfo.sched_epoch(sched) or 0
    except Exception as exc:
        guard.fail("preflight scheduler copy", exc)
        return None


def _same_loader(cut: dict[str, Any], iterable: Iterable) -> bool:
    if id(iterable) == cut["id"]:
        return True
    return type(iterable).__name__ == cut["type"] and _len(iterable) == cut["len"]


def _len(iterable: Any) -> int | None:
    try:
        return len(iterable)
    except Exception:
        return None


def _cuda_peak() -> int | None:
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_initialized():
            return int(torch.cuda.max_memory_allocated())
    except Exception:
        pass
    return None


def _world_size() -> int:
    try:
        return max(1, int(os.environ.get("WORLD_SIZE", "1") or 1))
    except ValueError:
        return 1
