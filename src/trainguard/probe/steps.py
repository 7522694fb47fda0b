"""Step assembly: the probe's hot path on the training thread.

A step's record is filled from two sides: `step()` (the loss side: each micro-batch's loss, parts and
weights, the data wait) and the optimizer hooks (probe/opthooks.py: LR, gradient norm, update ratio, loss
scale). `step()` keeps detached references to what it is given (a list append, a set lookup per value's
type, a counter) and nothing else: no clock read. When both halves are in, or the other half is clearly
never coming, the step is emitted on the training thread (`_emit`) into the hand-off (probe/handoff.py).
On the CPU its numbers are read there and the references dropped. On a GPU only their version counters are
read and the training thread's stream noted; the drain (probe/drain.py, the background thread) stacks each
step's values on that stream, copies several steps' vectors to the host at once and makes the rows.

The assembler knows the drain only through the hand-off: it is driven alone in tests/test_steps.py. The
guard binds its hot methods (`step`, `log`) once, so the training loop reaches them without a delegating
call. Nothing here reads a number back from the device; counting goes on even when the guard switched
itself off (the loop's `due()` depends on it).
"""

from __future__ import annotations

import numbers
import sys
import threading
import time
from threading import get_ident
from typing import Any

from trainguard.contract import EVENT_PROBE
from trainguard.probe import devicestats, thisprocess
from trainguard.probe.capturegate import GATE
from trainguard.probe.fastforward import NO_FAST_FORWARD
from trainguard.probe.handoff import Handoff
from trainguard.probe.phases import Phases
from trainguard.probe.replay import BatchRing
from trainguard.probe.samples import MemorySampler
from trainguard.probe.schedclock import SchedClock
from trainguard.probe.state import ProbeState
from trainguard.store.writer import StoreWriter

# GPU steps whose values wait, unstacked, for the background thread (each holds a dozen small device tensors);
# past this many (a loop of thousands of steps a second, a background thread held up) steps are stacked as they close
MAX_DEFERRED_STEPS = 256
# The steps whose values are asked whether one is a whole vector (a per-sample loss, reduced at once rather
# than held): the first DIMS_WARMUP, then every DIMS_EVERY-th
DIMS_WARMUP = 16
DIMS_EVERY = 64
DEVICE_LOOKS = 16  # closed steps whose loss is asked where it lives, until one is on a GPU


is_tensor = devicestats.is_tensor


class StepRecorder:
    """Micro-batches and optimizer steps of one training thread, assembled into records for the hand-off."""

    def __init__(self, state: ProbeState, handoff: Handoff, writer: StoreWriter, *, grad_accum: int,
                 total_steps: int | None, stats_every: int, optimizer: Any, scaler: Any,
                 memory: MemorySampler | None = None, phases: Phases | None = None) -> None:
        self.state = state
        self.handoff = handoff
        self.writer = writer  # (rare events only: set_step's; rows go through the hand-off)
        self.grad_accum = grad_accum
        self.total_steps = total_steps
        self.stats_every = stats_every
        self.optimizer = optimizer  # None when there is none, or it has no step hooks
        self.scaler = scaler
        self.pid = state.pid  # (a plain attribute: the hot path's one fork test, `thisprocess.pid != self.pid`)
        self.uses_step = False  # the loop calls guard.step (until it does, the optimizer hooks close steps)
        # open steps' records by optimizer step, filled from both sides (the optimizer hooks fill theirs)
        self.records: dict[int, dict[str, Any]] = {}
        # the current step's values as the loop gave them: (name, tensor or number), or (prefix, {key: value})
        # for a dict of parts; resolved by `devicestats.resolve`, off the hot path
        self.pending: list[tuple[str, Any]] = []
        # the current step's device intervals by name (`add_interval`): the last of each, as a row keeps it
        self.intervals: dict[str, tuple[Any, Any]] = {}
        self._weights: dict[str, Any] = {}  # the last weights given (numbers or tensors)
        self._weights_fresh = False  # given during the current step (tensor weights are recorded only then)
        self._weights_given: dict[str, Any] | None = None  # the weights the last call gave, as given
        self._value_types: set[type] = set()  # types seen among the values given, tensors or numbers
        self._tensor_types: set[type] = set()  # ... those of them that are tensors
        self.data_wait = 0.0  # seconds the loop waited for its batches this step (guard.batches adds them)
        self._t_last_close: float | None = None
        self._sched = SchedClock()  # the training thread's CPU time and run-queue wait, every 8th step
        self.phases = phases if phases is not None else Phases()
        self.cuda_index: int | None = None  # the GPU the loss (or the model) lives on, once seen
        self._device_looked = 0  # closed steps whose loss was asked where it lives (until one on a GPU)
        self.output_kept = False  # the contract checks hold a sampled forward's output for this micro-batch's loss
        self._step_thread: int | None = None  # the training thread: the first to call `step`
        self._thread_lock = threading.Lock()
        self._thread_refused = False
        self.ring = BatchRing()  # recent batches from guard.batches, to save the one that made a NaN
        self._experts_seen: set[tuple[int, Any]] = set()
        self.memory = memory if memory is not None else MemorySampler(writer, state.selflog, self.phases, total_steps)
        # set by the guard once its parts exist: the preflight mode (a do-nothing default) and the contracts
        self.fast_forward: Any = NO_FAST_FORWARD
        self.contracts: Any = None

    @property
    def micro(self) -> int:
        """Micro-batches seen so far."""
        return self.state.micro

    @property
    def opt_steps(self) -> int:
        """Optimizer steps seen by the optimizer hooks so far."""
        return self.state.opt_steps

    @property
    def step_count(self) -> int:
        """Optimizer steps done so far."""
        st = self.state
        return max(st.opt_steps, st.loss_steps)

    def at_boundary(self) -> bool:
        """Between optimizer steps: never in the middle of a gradient-accumulation window."""
        return not self.uses_step or self.state.micro % self.grad_accum == 0

    # -- the hot path ------------------------------------------------------------------------------

    def step(self, loss: Any, parts: dict[str, Any] | None = None, weights: dict[str, float] | None = None) -> None:
        """Called once per micro-batch (each forward/backward), before or after `optimizer.step()`.

        `loss` is the total loss (tensor or float); `parts` are its named components, `weights` the
        (scheduled) weight each part carries in the total. Nothing is read back from the device here.
        """
        # Every line here runs in a cache the model's forward and backward just emptied: each attribute
        # touched costs, so the checks are few and the work (the values' reading, the step's record) waits
        # for the step's close, the optimizer's hooks or the background thread (issue 21).
        if thisprocess.pid != self.pid:
            return  # a forked child (a DataLoader worker running the loop's code) counts nothing
        if get_ident() != self._step_thread and not self._claim_thread():
            return
        if GATE.capturing and GATE.here():
            return self._in_capture("guard.step")
        # Counting goes on even when the guard switched itself off: the loop's `due()` depends on it.
        st = self.state
        st.micro = micro = st.micro + 1
        closes = not micro % self.grad_accum
        if closes:
            st.loss_steps += 1
        if st.disabled:
            return
        try:
            st.ticks += 1
            self.uses_step = True
            known = self._value_types  # types seen to be tensors or numbers: a set lookup, not a check
            tensor = self._tensor_types
            if type(loss) not in known:
                self._check_value(loss)
            # Detached (~1 us): a reference to the loss itself would keep the micro-batch's autograd graph
            # alive until the step is emitted, and free it inside the guard's call instead of in the loop,
            # where it is freed unguarded (~30 us a micro-batch of a small transformer's graph). The values
            # are read (CPU) or stacked (GPU) once, as the step is emitted (`_emit`).
            self.pending.append(("loss", loss.detach() if type(loss) in tensor else loss))
            if self.output_kept:
                self.contracts.on_loss(loss)  # (only a sampled forward keeps an output for the loss check)
            if parts:
                if not known.issuperset(map(type, parts.values())):  # (every value's type known: one C call)
                    self._check_values(parts.values())
                kept = {}  # a copy (a loop may refill one dict every call), its tensors detached as the loss is
                for key, value in parts.items():
                    kept[key] = value.detach() if type(value) in tensor else value
                self.pending.append(("part:", kept))
            if weights:
                self._weights_given = weights  # (the last call's weights are the step's: taken at the close)
            if closes:
                self._close_loss_side(st.loss_steps)
        except Exception as exc:  # the guard never becomes the failure
            st.fail("step", exc)
        if closes and self.fast_forward.active:
            self.fast_forward.after_step()  # may end the script (preflight only, on purpose)

    def _check_values(self, values: Any) -> None:
        """`_check_value` of each value whose type is not known yet."""
        known = self._value_types
        for value in values:
            if type(value) not in known:
                self._check_value(value)

    def _check_value(self, value: Any) -> None:
        """A value of a type not seen before: a tensor or a number is fine (and its type remembered);
        anything else raises here, on the call that gave it, as `float(value)` does."""
        if is_tensor(value):
            self._tensor_types.add(type(value))
            self._value_types.add(type(value))
        elif isinstance(value, numbers.Real):
            self._value_types.add(type(value))
        else:
            float(value)  # a numeric string is taken (as before, and read later); "abc" or an object raises

    def _claim_thread(self) -> bool:
        """`step` from a thread that is not the training thread: the first thread to call it owns the guard.

        Why refuse rather than lock: a step is a sequence of micro-batches on one thread; calls from two
        threads interleave into steps that belong to neither (the duplicate rows with no loss this used to
        write). The other thread's calls are ignored, said once on stderr and in guard.log."""
        with self._thread_lock:
            if self._step_thread is None:
                self._step_thread = threading.get_ident()
                return True
            if threading.get_ident() == self._step_thread:
                return True
            if not self._thread_refused:
                self._thread_refused = True
                line = (f"trainguard: guard.step called from thread {threading.current_thread().name!r} while "
                        f"steps come from another thread: only that one is recorded; these calls are ignored "
                        f"(one training loop per guard)")
                self.state.selflog.write(line)
                try:
                    print(line, file=sys.stderr, flush=True)
                except (OSError, ValueError):
                    pass
            return False

    def _in_capture(self, what: str) -> None:
        """A call made while this thread captures a CUDA graph: ignored (its values are the graph's, not yet
        computed, and a replay runs no Python: the call belongs after each replay)."""
        self.state.selflog.once(f"{what} in capture", f"{what} called inside a CUDA graph capture: ignored (a graph "
                           f"replays without Python; call it after each replay)")

    def set_step(self, step: int) -> None:
        """Tells the guard the optimizer step a resumed run starts from (read from its checkpoint).

        Steps, `due()` and findings then continue from there instead of from 0. Call it once, after
        loading the checkpoint and before the first `guard.step` of the resumed run.
        """
        st = self.state
        if thisprocess.pid != self.pid:
            return
        try:
            step = int(step)
            if step < 0:
                raise ValueError(f"set_step: step must be >= 0, got {step}")
            st.opt_steps = st.loss_steps = step
            st.micro = step * self.grad_accum
            self.records.clear()
            self.pending = []
            self.intervals = {}
            self._t_last_close = None
            st.ticks += 1
            if not st.disabled:
                self.writer.add_event(EVENT_PROBE, "set_step", {"step": step}, step=step)
        except Exception as exc:
            st.fail("set_step", exc)

    def log(self, **values: Any) -> None:
        """Extra per-step scalars (tensors or floats), stored with the step being accumulated.

        Called after the step's last `guard.step`, they go with the next step.
        """
        if self.state.disabled or thisprocess.pid != self.pid:
            return
        try:
            self._check_values(values.values())
            self.pending.append(("x:", dict(values)))
        except Exception as exc:
            self.state.fail("log", exc)

    def experts(self, load: Any, layer: Any = None) -> None:
        """Per-expert load of an MoE layer (tokens routed to each expert), for `expert-collapse`.

        Call it each step for each MoE layer, during the forward (before that micro-batch's
        `guard.step`, which closes the step); it is recorded on the first `stats_every` steps and every
        `stats_every` steps after. A device tensor is copied to the host without a sync.
        """
        if self.state.disabled or GATE.capturing or thisprocess.pid != self.pid:
            return  # (a capture open: its pinned copy would invalidate the capture, probe/capturegate.py)
        try:
            step = self.step_count + 1  # the step in progress
            if step > self.stats_every and step % self.stats_every:
                return
            key = (step, layer)
            if key in self._experts_seen:
                return  # one report per layer and step (the loop may call it once per micro-batch)
            self._experts_seen.add(key)
            if len(self._experts_seen) > 1024:
                self._experts_seen = {k for k in self._experts_seen if k[0] >= step - 1}
            host, event = load, None
            if is_tensor(load):
                t = load.detach().float().reshape(-1)
                if t.device.type == "cuda":
                    host, event = devicestats.copy_to_host(t)
                else:
                    host = t.clone()
            self.handoff.experts.append((step, layer, host, event))
        except Exception as exc:
            self.state.fail("experts", exc)

    def add_value(self, name: str, value: Any) -> None:
        """One named value (a tensor or a number) for the step being accumulated."""
        self.pending.append((name, value))

    def add_interval(self, name: str, start: Any, end: Any) -> None:
        """The device time between two CUDA events (timing on) for the step being accumulated, in seconds
        under `name` (`x:...`: extra). Read only once the step's row is made, when its copies are done and
        so are the events before them: asking earlier would wait for the device."""
        self.intervals[name] = (start, end)  # (one a micro-batch: the last one's is the step's)

    def _close_loss_side(self, step: int, now: float | None = None) -> None:
        if now is None:
            now = time.time()
        if self._device_looked < DEVICE_LOOKS:
            self._look_for_device()
        given = self._weights_given
        if given is not None:
            self._weights_given = None
            known = self._value_types
            try:
                if not known.issuperset(map(type, given.values())):
                    self._check_values(given.values())
                # a copy (a loop may refill one dict every call); a weight given as a tensor goes through the
                # device copy like a part (float(tensor) would sync)
                self._weights = dict(given)
                self._weights_fresh = True
            except Exception as exc:  # a weight that is no number: said, and the step closes without it
                self.state.fail("step weights", exc)
        last = self._t_last_close
        side = {"t": now, "micro": self.state.micro, "pending": self.pending, "weights": self._weights,
                "weights_fresh": self._weights_fresh, "data_wait": self.data_wait,
                "step_time": (now - last) if last is not None else None, "loss_done": True}
        if self.intervals:  # (only a distributed run on a GPU has them: probe/syncwait.py)
            side["intervals"], self.intervals = self.intervals, {}
        rec = self.records.get(step)
        if rec is None:
            rec = self.records[step] = {"step": step, **side}
        else:
            rec.update(side)
        if step % 8 == 0:  # one pread, no device sync: for throughput-drop to tell whose slowdown it is
            clock = self._sched.per_step(step)
            if clock is not None:
                rec["clock"] = clock
        if self.scaler is not None:
            # read on the loss side too: a step the GradScaler skips never reaches the optimizer hooks
            scale = getattr(self.scaler, "_scale", None)
            if scale is not None:
                rec["pending"].append(("loss_scale", devicestats.snapshot_scalar(scale)))
        self.pending = []
        self._weights_fresh = False
        self.data_wait = 0.0
        self._t_last_close = now
        self._maybe_emit(step)

    def _look_for_device(self) -> None:
        """At the first closed steps: the device the loss lives on. Its steps are stacked on it (`_emit`),
        and the memory samples of the background thread (whose own "current device" is always 0) read it.
        Asked until a loss is on a GPU or DEVICE_LOOKS steps closed (a first loss given as a number)."""
        self._device_looked += 1
        if self.cuda_index is not None:
            self._device_looked = DEVICE_LOOKS
            return
        for name, value in self.pending:
            if name == "loss" and getattr(value, "is_cuda", False):
                self.cuda_index = self.memory.cuda_index = value.device.index
                self._device_looked = DEVICE_LOOKS
                return

    # -- the optimizer's side (called by probe/opthooks.py) ----------------------------------------------

    def opt_step_done(self, update_ratio: Any = None) -> None:
        """The optimizer stepped (its post-hook): the step's optimizer half is in."""
        self.state.ticks += 1
        step = self.state.opt_steps
        rec = self.records.get(step)
        if rec is None:
            rec = self.records[step] = {"step": step}
        if update_ratio is not None:
            rec.setdefault("opt_tensors", []).append(("update_ratio", update_ratio))
        rec["opt_done"] = True
        if not self.uses_step:
            rec.setdefault("t", time.time())
            if self.pending:
                # a loop that never calls guard.step: what guard.log() gathered belongs to this step
                rec["pending"] = self.pending
                self.pending = []
            if self.intervals:  # ... and so do its device intervals (else they are held, never read)
                rec["intervals"], self.intervals = self.intervals, {}
        self._maybe_emit(step)

    def _maybe_emit(self, step: int) -> None:
        records = self.records
        rec = records.get(step)
        if rec is None:
            return
        # Whether the loop calls `guard.step` is unknown until it first does (it may step the optimizer
        # first), so the loss half is always awaited; the optimizer half only when there is an optimizer.
        if rec.get("loss_done") and (self.optimizer is None or rec.get("opt_done")):
            self._emit(records.pop(step))
        # A step whose other half never came (an optimizer step skipped by the GradScaler, a loop that
        # steps the optimizer without `guard.step`) is emitted once two newer steps exist.
        if records and (len(records) > 1 or step not in records):
            for old in [k for k in records if k < step - 1]:
                rec = records.pop(old)
                rec["incomplete"] = incomplete = self.uses_step
                if incomplete and self.optimizer is not None and not rec.get("opt_done"):
                    rec["opt_skipped"] = True  # (the row says optimizer_step_skipped)
                self._emit(rec)

    def _emit(self, rec: dict[str, Any]) -> None:
        """The step is complete (its loss side closed and its optimizer side in). On the CPU its values are
        read here (numbers where they are: nothing to wait for) and the loop's references dropped, so what
        is recorded is the step's own number however late the background thread runs. On a GPU they go to
        the background thread, which stacks them on this thread's stream and copies them to the host."""
        step = rec["step"]
        memory = self.memory
        if step >= memory.next_step:  # (a memory sample is due every few steps: asked here, without a call)
            memory.on_step(rec)
        if self.state.device_broken:
            return
        inflight = self.handoff.steps
        cuda = self.cuda_index is not None
        if cuda and not (self.handoff.stage_here or GATE.captured or len(inflight) >= MAX_DEFERRED_STEPS):
            # On a GPU the stack is left to the background thread (on this thread's stream): here, one launch
            # and a dozen values gathered cost more than reading their version counters (~0.1 us each), which
            # is all that is done, so that a value the loop changes in place after giving it (an accumulator
            # zeroed for the next window) is seen changed there instead of read wrong. Whether one is a whole
            # vector (held, not reduced) is asked on a sample of steps: a loop gives the same kind each step.
            versions = devicestats.versions(rec.get("pending", ()), rec.get("weights"), rec.get("weights_fresh", False),
                                            dims=step <= DIMS_WARMUP or not step % DIMS_EVERY)
            if versions is not None:
                rec["versions"] = versions
                rec["stream"] = devicestats.current_stream(self.cuda_index)
                inflight.append((rec, devicestats.DEFERRED))
                return
        # ...unless they cannot wait (a value was seen changed in place, a CUDA graph replays into them without
        # moving their counters, one has no counter or is a whole vector, the background thread is far behind),
        # or they live on the CPU: read here (about what reading their version counters would cost, and the
        # background thread is left nothing to read)
        pending, weights = rec.pop("pending", ()), rec.pop("weights", None)
        fresh, opt_tensors = rec.pop("weights_fresh", False), rec.pop("opt_tensors", ())
        try:
            if cuda:
                packs, rec["floats"] = devicestats.stage_step(pending, weights, fresh, opt_tensors)
            else:
                named, rec["floats"] = devicestats.resolve(pending, weights, fresh, opt_tensors)
                packs = devicestats.stage(named) if named else []  # (tensors of another device: read off this thread)
        except Exception as exc:
            if devicestats.is_device_error(exc):
                self.handoff.abandon(self.state, exc)  # a sticky device error: every later launch fails too
                return
            self.state.fail("step values", exc)  # a value that is no number: the row goes without the step's values
            packs, rec["floats"] = [], {}
        inflight.append((rec, packs))

    def emit_all(self) -> None:
        """Everything still open becomes a row to drain: the run is ending."""
        if self.state.device_broken:
            return
        has_loss = any(n == "loss" for n, _ in self.pending)
        if has_loss:
            # micro-batches of a last, partial accumulation window still belong to a step (scalars
            # logged after the last step alone do not make one)
            self._close_loss_side(self.state.loss_steps + 1, time.time())
        for key in sorted(self.records):
            rec = self.records.pop(key)
            if not (rec.get("loss_done") or rec.get("opt_done")):
                continue
            self._emit(rec)
