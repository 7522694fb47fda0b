"""The probe: the part of trainguard that lives inside the training process.

    guard = trainguard.watch(model, optimizer, scheduler, total_steps=10_000, grad_accum=8)
    with guard.phase("train"):
        for batch in guard.batches(loader):
            loss = ...; loss.backward()
            guard.step(loss, parts={"kd": kd, "lm": lm})
            ...
    guard.finish()

Definitions used everywhere in trainguard:
- a *micro-batch* is one forward/backward, one `guard.step` call;
- a *step* is one optimizer update (`grad_accum` micro-batches), as in Hugging Face and Lightning.

`Guard` is the public face; the work is done by parts, each in a module of its own:
- probe/steps.py: step assembly, the hot path (`step`, `log`, `set_step`, `experts`). Each is the
  guard's own attribute (the bound method, set once), so the loop reaches it without a delegating call.
  It appends to lists and launches a few tiny kernels; it never reads a number back from the device; it
  hands finished records to the drain through probe/handoff.py;
- probe/state.py: what every part shares (pid, switched off, its errors, progress counters);
- probe/opthooks.py: the optimizer's hooks (LR, gradient norm, update ratio) and, where the contract
  checks' forward pre-hook (probe/contracts.py) does not count each forward as progress, a mark that does;
- probe/drain.py: the background thread that turns finished device copies into rows and commits them;
- probe/flightanswers.py: the flight-recorder responder (its own thread once the run is distributed);
- probe/crashhook.py: the uncaught exception, recorded with its step and phase;
- probe/alone.py: the standalone ending (status.json and the health rules when no watchdog owns them),
  or `Watched`, which does nothing; chosen once at start-up;
- probe/fastforward.py: preflight's mode, or the do-nothing default; chosen once at start-up;
- probe/core.py: `Probe`, those parts wired, started and finished; the automatic probe (probe/auto.py)
  is a Probe, the guard's parts without this face. A Guard has a Probe (`guard.probe`).
Every public method catches its own errors: a broken guard logs to `guard.log` in the run folder and
steps aside, it never breaks the training loop.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from trainguard.contract import (
    ENV_RESUME_FROM,
    EVENT_CHECKPOINT,
    EVENT_EVAL,
    EVENT_PHASE,
    STOP_REQUESTED_FILE,
)
from trainguard.probe import thisprocess
from trainguard.probe.core import Probe
from trainguard.probe.crashhook import active_guard
from trainguard.probe.steps import is_tensor

__all__ = ["Guard", "active_guard"]

NOT_KEPT_IN_A_ROW = 16  # batches not kept by the ring in a row, after which a loader's are no longer offered
_Batch = TypeVar("_Batch")  # what the loader yields: guard.batches(loader) yields the same


class Guard:
    """Watches one training process. Make it with `trainguard.watch(...)`.

    A guard has a probe (probe/core.py: the assembler, the drain and the rest, wired) and is the script's
    face of it. The hot methods (`step`, `log`, `set_step`, `experts`) are the assembler's own bound
    methods, set on the guard once: `guard.step(...)` reaches probe/steps.py with no delegating call."""

    _stop_requested = False  # (stop_requested's) the scheduler asked, seen once: it stays asked
    _stop_checked = float("-inf")  # monotonic time of its last look

    if TYPE_CHECKING:  # the hot methods as a type checker sees them; at run time, the assembler's bound methods
        def step(self, loss: Any, parts: dict[str, Any] | None = None,
                 weights: dict[str, float] | None = None) -> None: ...
        def log(self, **values: Any) -> None: ...
        def set_step(self, step: int) -> None: ...
        def experts(self, load: Any, layer: Any = None) -> None: ...

    def __init__(self, model: Any = None, optimizer: Any = None, scheduler: Any = None, **options: Any) -> None:
        probe = self.probe = Probe(model, optimizer, scheduler, **options)
        self.state = probe.state
        self.step = probe.step  # type: ignore[method-assign]  # (StepRecorder.step, once per micro-batch)
        self.log = probe.log  # type: ignore[method-assign]
        self.set_step = probe.set_step  # type: ignore[method-assign]
        self.experts = probe.experts  # type: ignore[method-assign]
        self._due_last: dict[str, int] = {}  # (due's) due name -> the step it last answered True for

    def __deepcopy__(self, memo: dict[int, Any]) -> Guard:
        return self  # a deep-copied model's hooks share the process's one guard (probe/core.py says why)

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        from trainguard.probe.detached import Detached

        return (Detached, ())  # a pickled guard carries nothing (probe/detached.py says why)

    # -- what a script (and a test) reads of the run ----------------------------------------------------

    @property
    def run_dir(self) -> Path:
        """The run folder this process writes."""
        return self.probe.run_dir

    @property
    def rank(self) -> int:
        return self.probe.rank

    @property
    def attempt(self) -> int:
        """The watchdog's restart count (0: the first start)."""
        return self.probe.attempt

    @property
    def step_count(self) -> int:
        """Optimizer steps done so far."""
        st = self.state
        return max(st.opt_steps, st.loss_steps)

    @property
    def micro(self) -> int:
        """Micro-batches seen so far."""
        return self.state.micro

    @property
    def opt_steps(self) -> int:
        """Optimizer steps seen by the optimizer's hooks so far."""
        return self.state.opt_steps

    @property
    def finished(self) -> bool:
        return self.state.finished

    @property
    def summary(self) -> dict[str, Any]:
        """The last step row's step, loss and LR."""
        return self.probe.summary

    @property
    def model(self) -> Any:
        return self.probe.model

    @property
    def optimizer(self) -> Any:
        return self.probe.optimizer

    @property
    def writer(self) -> Any:
        return self.probe.writer

    @property
    def contracts(self) -> Any:
        return self.probe.contracts

    @property
    def fast_forward(self) -> Any:
        return self.probe.fast_forward

    def finish(self) -> None:
        """The script reached its end: flush everything and mark the probe finished (`Probe.finish`)."""
        self.probe.finish()

    # ---------------------------------------------------------------------------------------------
    # public API (the hot path, `step` and `log`, is the assembler's): each method never raises

    @property
    def resume_from(self) -> str | None:
        """The checkpoint to resume from when the watchdog (or preflight) restarted this script, else None."""
        self.probe.fast_forward.note_resume_read()
        return os.environ.get(ENV_RESUME_FROM) or None

    def batches(self, iterable: Iterable[_Batch]) -> Iterator[_Batch]:
        """Yields from `iterable`, measuring the time spent waiting for each item (data wait)."""
        st, probe = self.state, self.probe
        if probe.contracts is not None and not st.disabled:
            probe.contracts.loader(iterable)  # fingerprints DataLoader workers' generators (fail-open)
        iterator = iter(probe.fast_forward.batches(iterable))
        perf_counter, keep = time.perf_counter, probe.ring.keep
        # A loader whose batches are never kept (they come on the device, or larger than the ring) is not
        # asked again after a few: two calls a micro-batch saved where the loop is launch-bound
        not_kept = 0
        while True:
            t0 = perf_counter()
            try:
                item = next(iterator)
            except StopIteration:
                return
            if not st.disabled:
                probe.data_wait += perf_counter() - t0
                st.ticks += 1  # a batch is progress (counted: probe/state.py says why not a clock read)
                if not_kept < NOT_KEPT_IN_A_ROW:
                    try:
                        not_kept = 0 if keep(st.micro + 1, item) else not_kept + 1  # (for the next guard.step)
                    except Exception as exc:
                        st.fail("batches", exc)
            yield item

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Marks a phase of the run ("train", "eval", "save", ...): start, end and duration are recorded."""
        if not isinstance(name, str):
            name = str(name)  # a phase is named by text in the store; ("eval", "val") is kept as its repr
        self._phase_event("begin", name)
        t0 = time.time()
        try:
            yield
        except BaseException as exc:
            self.probe.phases.left_by(exc)  # the phase is left before the crash hook runs: remember where it was
            raise
        finally:
            self._phase_event("end", name, seconds=time.time() - t0)

    def _phase_event(self, edge: str, name: str, **data: Any) -> None:
        st, probe = self.state, self.probe
        if st.disabled or thisprocess.pid != st.pid:
            return
        try:
            st.t_progress = time.time()
            if edge == "begin":
                data["nth"] = probe.phases.begin(name)
            else:
                probe.phases.end(name)
            probe.writer.add_event(EVENT_PHASE, name, {"edge": edge, **data}, step=st.step_count)
        except Exception as exc:
            st.fail("phase", exc)

    def due(self, name: str, every: int) -> bool:
        """True once at every `every`-th optimizer step (e.g. `if guard.due("eval", every=2000): ...`)."""
        try:
            st = self.state
            opt_steps, loss_steps = st.opt_steps, st.loss_steps
            step = opt_steps if opt_steps > loss_steps else loss_steps  # step_count, without the property's call
            fast_forward = self.probe.fast_forward
            if fast_forward.active and fast_forward.due(name, every):
                self._due_last[name] = step
                return True
            if every <= 0 or step <= 0 or step % every != 0:
                return False
            if self._due_last.get(name) == step:
                return False  # already answered for this step (the loop may ask once per micro-batch)
            self._due_last[name] = step
            return True
        except Exception as exc:
            self.state.fail("due", exc)
            return False

    def eval(self, **metrics: Any) -> None:
        """Records evaluation results, e.g. `guard.eval(loss=val_loss, accuracy=acc)`."""
        st = self.state
        if st.disabled or thisprocess.pid != st.pid:
            return
        try:
            # Evaluation is rare and off the hot path: reading a tensor here may synchronise, once.
            values = {k: _to_float(v) for k, v in metrics.items()}
            st.t_progress = time.time()
            self.probe.writer.add_event(EVENT_EVAL, None, values, step=st.step_count)
        except Exception as exc:
            st.fail("eval", exc)

    def checkpoint_saved(self, path: str | os.PathLike[str]) -> None:
        """Tells trainguard a checkpoint was written; restarts and preflight resume from the newest one."""
        st = self.state
        if st.disabled or thisprocess.pid != st.pid:
            return
        try:
            p = Path(path)
            size = p.stat().st_size if p.exists() and p.is_file() else None
            st.t_progress = time.time()
            self.probe.writer.add_event(EVENT_CHECKPOINT, str(p), {"path": str(p.resolve()), "bytes": size},
                                        step=st.step_count)
            self.probe.verify_checkpoint(p.resolve())
        except Exception as exc:
            st.fail("checkpoint_saved", exc)

    @property
    def stop_requested(self) -> bool:
        """True once the job scheduler warned of, or began, the job's end (a time limit, a preemption):
        save a checkpoint and stop. `trainguard run` sets it on the scheduler's signal (sbatch --signal's
        warning, or its SIGTERM); read it once per step or so: it looks at most once a second."""
        if self._stop_requested:
            return True
        now = time.monotonic()
        if now < self._stop_checked + 1.0:
            return False
        self._stop_checked = now
        try:
            self._stop_requested = os.path.lexists(Path(self.probe.run_dir) / STOP_REQUESTED_FILE)
        except Exception:
            return False  # fail-open: a folder that cannot be looked at asks for nothing
        return self._stop_requested

    def __enter__(self) -> Guard:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.finish()


def _to_float(value: Any) -> Any:
    if is_tensor(value):
        return float(value.detach().float().mean().item()) if value.numel() != 1 else float(value.item())
    if isinstance(value, (int, float)):
        return float(value)
    return value
