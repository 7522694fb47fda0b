"""Step assembly: the probe's hot path on the training thread, and the rows its steps become.

A step's record is filled from two sides: `step()` (the loss side: each micro-batch's loss, parts and
weights, the data wait) and the optimizer hooks (probe/opthooks.py: LR, gradient norm, update ratio, loss
scale). `step()` keeps detached references to what it is given (a list append, a set lookup per value's
type, a counter) and nothing else: no clock read. When both halves are in, or the other half is clearly
never coming, the step is emitted on the training thread (`_emit`). On the CPU its numbers are read there
and the references dropped. On a GPU only their version counters are read and the training thread's
stream noted; the background thread (probe/flusher.py, `drain()`) stacks each step's values into one vector
on that stream (`devicestats.stage_step`), checks that no value changed in place since it was given, copies
the vectors of several steps to the host at once (`devicestats.copy_staged`) and, waiting for no copy,
turns the finished ones into step rows for the store.

`Guard` is a StepRecorder: the hot path (`step`, `log`) is this class's own code, reached by the
training loop without a delegating call. Nothing here reads a number back from the device; counting goes
on even when the guard switched itself off (the loop's `due()` depends on it).
"""

from __future__ import annotations

import math
import numbers
import os
import sys
import threading
import time
from pathlib import Path
from threading import get_ident
from typing import Any

from trainguard.contract import (
    BEAT_FINISHED,
    BEAT_RUNNING,
    EVENT_EXPERTS,
    EVENT_PROBE,
    EVENT_SAMPLE,
    FLIGHT_ANSWER_PREFIX,
)
from trainguard.probe import collectives, devicestats, flightrec, thisprocess
from trainguard.probe.capturegate import GATE
from trainguard.probe.fastforward import NO_FAST_FORWARD
from trainguard.probe.pacing import breathe, paced
from trainguard.probe.phases import Phases
from trainguard.probe.replay import BatchRing
from trainguard.probe.samples import MemorySampler
from trainguard.probe.schedclock import SchedClock
from trainguard.store.selflog import GuardLog
from trainguard.store.writer import StoreWriter

# GPU steps whose values wait, unstacked, for the background thread (each holds a dozen small device tensors);
# past this many (a loop of thousands of steps a second, a background thread held up) steps are stacked as they close
MAX_DEFERRED_STEPS = 256
# The steps whose values are asked whether one is a whole vector (a per-sample loss, reduced at once rather
# than held): the first DIMS_WARMUP, then every DIMS_EVERY-th
DIMS_WARMUP = 16
DIMS_EVERY = 64
DEVICE_LOOKS = 16  # closed steps whose loss is asked where it lives, until one is on a GPU
MAX_GUARD_ERRORS = 20  # past this many of its own errors the guard switches itself off
BEAT_REFRESH = 5.0  # seconds: an unchanged heartbeat is written again after this long (its t_flush)
# seconds between looks at a device copy the last drain waits for: at once, then doubling up to 50 ms
DEVICE_POLL_FIRST = 0.0005
DEVICE_POLL_MAX = 0.05
FLIGHT_POLL_S = 0.5  # seconds between looks for the watchdog's flight-recorder request, distributed runs


is_tensor = devicestats.is_tensor


class StepRecorder:
    """Micro-batches and optimizer steps of one training thread, assembled into step rows."""

    def __init__(self, *, writer: StoreWriter, selflog: GuardLog, run_dir: Path, rank: int, grad_accum: int,
                 total_steps: int | None, stats_every: int, optimizer: Any, scaler: Any) -> None:
        self._writer = writer
        self._selflog = selflog
        self.run_dir = run_dir
        self.rank = rank
        self.grad_accum = grad_accum
        self.total_steps = total_steps
        self.stats_every = stats_every
        self.optimizer = optimizer  # None when there is none, or it has no step hooks
        self.scaler = scaler
        self._pid = os.getpid()
        # counters: micro-batches seen, optimizer steps seen by the hooks, steps closed by `step()`
        self.micro = 0
        self.opt_steps = 0
        self._loss_steps = 0
        self._uses_step = False
        self._records: dict[int, dict[str, Any]] = {}
        # completed steps for the background thread: (record, None) while its values are references (no
        # GPU), then (record, [DevicePack or Staged, ...]); see `_emit` and `_prepare`
        self._inflight: list[tuple[dict[str, Any], Any]] = []
        # the current step's values as the loop gave them: (name, tensor or number), or (prefix, {key: value})
        # for a dict of parts; resolved by `devicestats.resolve`, off the hot path
        self._pending: list[tuple[str, Any]] = []
        # the current step's device intervals by name (`_add_interval`): the last of each, as a row keeps it
        self._intervals: dict[str, tuple[Any, Any]] = {}
        self._weights: dict[str, Any] = {}  # the last weights given (numbers or tensors)
        self._weights_fresh = False  # given during the current step (tensor weights are recorded only then)
        self._weights_given: dict[str, Any] | None = None  # the weights the last call gave, as given
        self._value_types: set[type] = set()  # types seen among the values given, tensors or numbers
        self._tensor_types: set[type] = set()  # ... those of them that are tensors
        self._data_wait = 0.0
        self._t_last_close: float | None = None
        self._sched = SchedClock()  # the training thread's CPU time and run-queue wait, every 8th step
        # Progress. The hot calls (`step`, each batch, each forward, each optimizer step) count it in
        # `_ticks` rather than read a clock (a clock read costs ~2 us in a real loop's cold cache, and there
        # are a dozen of them a step); the background thread turns a count that moved into the time of its
        # pass (at most a flush interval late: a stall then looks shorter, never longer). Rare calls (phases,
        # evaluations, checkpoints) set `_t_progress` themselves.
        self._ticks = 0
        self._ticks_seen = 0
        self._t_progress: float | None = None
        self._last_beat: tuple[Any, ...] | None = None  # the heartbeat last queued (without its flush time), and when
        self._last_beat_t = 0.0
        self.phases = Phases()
        self._device_broken = False
        # a GPU run's values stacked as each step closes (`_emit`), not by the background thread: once a value
        # was seen changed in place after it was given
        self._stage_here = False
        self.update_snapshot: Any = None  # the optimizer hooks' parameter sample before an update (device)
        self._cuda_index: int | None = None
        self._device_looked = 0  # closed steps whose loss was asked where it lives (until one on a GPU)
        self._output_kept = False  # the contract checks hold a sampled forward's output for this micro-batch's loss
        self._errors = 0
        self._disabled = False
        self._step_thread: int | None = None  # the training thread: the first to call `step`
        self._thread_lock = threading.Lock()
        self._thread_refused = False
        self.finished = False
        self.crashed = False
        self._observers: list[Any] = []  # callables fed each resolved step row (online rules)
        self._summary: dict[str, Any] = {"step": 0, "loss": None, "lr": None}
        self._ring = BatchRing()  # recent batches from guard.batches, to save the one that made a NaN
        self._experts_inflight: list[tuple[int, Any, Any, Any]] = []
        self._experts_seen: set[tuple[int, Any]] = set()
        self.memory = MemorySampler(writer, selflog, self.phases, total_steps)
        self._drain_lock = threading.Lock()
        self.ending: threading.Event | None = None  # set once the run is ending (the flusher's; see probe/pacing.py)
        self._flight_thread: threading.Thread | None = None  # answers the flight-recorder requests (distributed)
        self.flight_done = threading.Event()  # set once the last drain is over: that thread ends
        # set by the guard once its parts exist: the preflight mode (a do-nothing default) and the contracts
        self.fast_forward: Any = NO_FAST_FORWARD
        self._contracts: Any = None

    @property
    def step_count(self) -> int:
        """Optimizer steps done so far."""
        return max(self.opt_steps, self._loss_steps)

    @property
    def summary(self) -> dict[str, Any]:
        """The last step row's step, loss and LR (for status.json)."""
        return self._summary

    def at_boundary(self) -> bool:
        """Between optimizer steps: never in the middle of a gradient-accumulation window."""
        return not self._uses_step or self.micro % self.grad_accum == 0

    def watching(self) -> bool:
        """Recording in this process (not switched off, not a forked child)."""
        return not self._disabled and thisprocess.pid == self._pid

    def mark_progress(self) -> None:
        self._t_progress = time.time()

    def progress_time(self) -> float | None:
        """The time of the last progress: the rare calls' own times, or this pass's if the count moved
        (background thread)."""
        ticks = self._ticks
        if ticks != self._ticks_seen:
            self._ticks_seen = ticks
            self._t_progress = max(self._t_progress or 0.0, time.time())
        return self._t_progress

    # -- the hot path ------------------------------------------------------------------------------

    def step(self, loss: Any, parts: dict[str, Any] | None = None, weights: dict[str, float] | None = None) -> None:
        """Called once per micro-batch (each forward/backward), before or after `optimizer.step()`.

        `loss` is the total loss (tensor or float); `parts` are its named components, `weights` the
        (scheduled) weight each part carries in the total. Nothing is read back from the device here.
        """
        # Every line here runs in a cache the model's forward and backward just emptied: each attribute
        # touched costs, so the checks are few and the work (the values' reading, the step's record) waits
        # for the step's close, the optimizer's hooks or the background thread (issue 21).
        if thisprocess.pid != self._pid:
            return  # a forked child (a DataLoader worker running the loop's code) counts nothing
        if get_ident() != self._step_thread and not self._claim_thread():
            return
        if GATE.capturing and GATE.here():
            return self._in_capture("guard.step")
        # Counting goes on even when the guard switched itself off: the loop's `due()` depends on it.
        self.micro = micro = self.micro + 1
        closes = not micro % self.grad_accum
        if closes:
            self._loss_steps += 1
        if self._disabled:
            return
        try:
            self._ticks += 1
            self._uses_step = True
            known = self._value_types  # types seen to be tensors or numbers: a set lookup, not a check
            tensor = self._tensor_types
            if type(loss) not in known:
                self._check_value(loss)
            # Detached (~1 us): a reference to the loss itself would keep the micro-batch's autograd graph
            # alive until the step is emitted, and free it inside the guard's call instead of in the loop,
            # where it is freed unguarded (~30 us a micro-batch of a small transformer's graph). The values
            # are read (CPU) or stacked (GPU) once, as the step is emitted (`_emit`).
            self._pending.append(("loss", loss.detach() if type(loss) in tensor else loss))
            if self._output_kept:
                self._contracts.on_loss(loss)  # (only a sampled forward keeps an output for the loss check)
            if parts:
                if not known.issuperset(map(type, parts.values())):  # (every value's type known: one C call)
                    self._check_values(parts.values())
                kept = {}  # a copy (a loop may refill one dict every call), its tensors detached as the loss is
                for key, value in parts.items():
                    kept[key] = value.detach() if type(value) in tensor else value
                self._pending.append(("part:", kept))
            if weights:
                self._weights_given = weights  # (the last call's weights are the step's: taken at the close)
            if closes:
                self._close_loss_side(self._loss_steps)
        except Exception as exc:  # the guard never becomes the failure
            self.fail("step", exc)
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
                self._selflog.write(line)
                try:
                    print(line, file=sys.stderr, flush=True)
                except (OSError, ValueError):
                    pass
            return False

    def _in_capture(self, what: str) -> None:
        """A call made while this thread captures a CUDA graph: ignored (its values are the graph's, not yet
        computed, and a replay runs no Python: the call belongs after each replay)."""
        self._selflog.once(f"{what} in capture", f"{what} called inside a CUDA graph capture: ignored (a graph "
                           f"replays without Python; call it after each replay)")

    def set_step(self, step: int) -> None:
        """Tells the guard the optimizer step a resumed run starts from (read from its checkpoint).

        Steps, `due()` and findings then continue from there instead of from 0. Call it once, after
        loading the checkpoint and before the first `guard.step` of the resumed run.
        """
        if thisprocess.pid != self._pid:
            return
        try:
            step = int(step)
            if step < 0:
                raise ValueError(f"set_step: step must be >= 0, got {step}")
            self.opt_steps = self._loss_steps = step
            self.micro = step * self.grad_accum
            self._records.clear()
            self._pending = []
            self._intervals = {}
            self._t_last_close = None
            self._ticks += 1
            if not self._disabled:
                self._writer.add_event(EVENT_PROBE, "set_step", {"step": step}, step=step)
        except Exception as exc:
            self.fail("set_step", exc)

    def log(self, **values: Any) -> None:
        """Extra per-step scalars (tensors or floats), stored with the step being accumulated.

        Called after the step's last `guard.step`, they go with the next step.
        """
        if self._disabled or thisprocess.pid != self._pid:
            return
        try:
            self._check_values(values.values())
            self._pending.append(("x:", dict(values)))
        except Exception as exc:
            self.fail("log", exc)

    def experts(self, load: Any, layer: Any = None) -> None:
        """Per-expert load of an MoE layer (tokens routed to each expert), for `expert-collapse`.

        Call it each step for each MoE layer, during the forward (before that micro-batch's
        `guard.step`, which closes the step); it is recorded on the first `stats_every` steps and every
        `stats_every` steps after. A device tensor is copied to the host without a sync.
        """
        if self._disabled or GATE.capturing or thisprocess.pid != self._pid:
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
            self._experts_inflight.append((step, layer, host, event))
        except Exception as exc:
            self.fail("experts", exc)

    def _add_value(self, name: str, value: Any) -> None:
        """One named value (a tensor or a number) for the step being accumulated."""
        self._pending.append((name, value))

    def _add_interval(self, name: str, start: Any, end: Any) -> None:
        """The device time between two CUDA events (timing on) for the step being accumulated, in seconds
        under `name` (`x:...`: extra). Read only once the step's row is made, when its copies are done and
        so are the events before them: asking earlier would wait for the device."""
        self._intervals[name] = (start, end)  # (one a micro-batch: the last one's is the step's)

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
                self.fail("step weights", exc)
        last = self._t_last_close
        side = {"t": now, "micro": self.micro, "pending": self._pending, "weights": self._weights,
                "weights_fresh": self._weights_fresh, "data_wait": self._data_wait,
                "step_time": (now - last) if last is not None else None, "loss_done": True}
        if self._intervals:  # (only a distributed run on a GPU has them: probe/syncwait.py)
            side["intervals"], self._intervals = self._intervals, {}
        rec = self._records.get(step)
        if rec is None:
            rec = self._records[step] = {"step": step, **side}
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
        self._pending = []
        self._weights_fresh = False
        self._data_wait = 0.0
        self._t_last_close = now
        self._maybe_emit(step)

    def _look_for_device(self) -> None:
        """At the first closed steps: the device the loss lives on. Its steps are stacked on it (`_emit`),
        and the memory samples of the background thread (whose own "current device" is always 0) read it.
        Asked until a loss is on a GPU or DEVICE_LOOKS steps closed (a first loss given as a number)."""
        self._device_looked += 1
        if self._cuda_index is not None:
            self._device_looked = DEVICE_LOOKS
            return
        for name, value in self._pending:
            if name == "loss" and getattr(value, "is_cuda", False):
                self._cuda_index = self.memory.cuda_index = value.device.index
                self._device_looked = DEVICE_LOOKS
                return

    # -- the optimizer's side (called by probe/opthooks.py) ----------------------------------------------

    def opt_record(self, step: int) -> dict[str, Any]:
        """The record of optimizer step `step`, for the optimizer hooks to fill."""
        rec = self._records.get(step)
        if rec is None:
            rec = self._records[step] = {"step": step}
        return rec

    def opt_step_done(self, update_ratio: Any = None) -> None:
        """The optimizer stepped (its post-hook): the step's optimizer half is in."""
        self._ticks += 1
        step = self.opt_steps
        rec = self._records.get(step)
        if rec is None:
            rec = self._records[step] = {"step": step}
        if update_ratio is not None:
            rec.setdefault("opt_tensors", []).append(("update_ratio", update_ratio))
        rec["opt_done"] = True
        if not self._uses_step:
            rec.setdefault("t", time.time())
            if self._pending:
                # a loop that never calls guard.step: what guard.log() gathered belongs to this step
                rec["pending"] = self._pending
                self._pending = []
            if self._intervals:  # ... and so do its device intervals (else they are held, never read)
                rec["intervals"], self._intervals = self._intervals, {}
        self._maybe_emit(step)

    def _maybe_emit(self, step: int) -> None:
        records = self._records
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
                rec["incomplete"] = self._uses_step
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
        if self._device_broken:
            return
        cuda = self._cuda_index is not None
        if cuda and not (self._stage_here or GATE.captured or len(self._inflight) >= MAX_DEFERRED_STEPS):
            # On a GPU the stack is left to the background thread (on this thread's stream): here, one launch
            # and a dozen values gathered cost more than reading their version counters (~0.1 us each), which
            # is all that is done, so that a value the loop changes in place after giving it (an accumulator
            # zeroed for the next window) is seen changed there instead of read wrong. Whether one is a whole
            # vector (held, not reduced) is asked on a sample of steps: a loop gives the same kind each step.
            versions = devicestats.versions(rec.get("pending", ()), rec.get("weights"), rec.get("weights_fresh", False),
                                            dims=step <= DIMS_WARMUP or not step % DIMS_EVERY)
            if versions is not None:
                rec["versions"] = versions
                rec["stream"] = devicestats.current_stream(self._cuda_index)
                self._inflight.append((rec, devicestats.DEFERRED))
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
                self.abandon_device(exc)  # a sticky device error: every later launch fails too (once, said)
                return
            self.fail("step values", exc)  # a value that is no number: the row goes without the step's values
            packs, rec["floats"] = [], {}
        self._inflight.append((rec, packs))

    def emit_all(self) -> None:
        """Everything still open becomes a row to drain: the run is ending."""
        if self._device_broken:
            return
        has_loss = any(n == "loss" for n, _ in self._pending)
        if has_loss:
            # micro-batches of a last, partial accumulation window still belong to a step (scalars
            # logged after the last step alone do not make one)
            self._close_loss_side(self._loss_steps + 1, time.time())
        for key in sorted(self._records):
            rec = self._records.pop(key)
            if not (rec.get("loss_done") or rec.get("opt_done")):
                continue
            self._emit(rec)

    # -- the background thread's side: device copies become rows -----------------------------------------

    def drain(self, final: bool = False) -> None:
        """Finished device copies become step rows in the store (all of them, waited for, when `final`)."""
        # the crash hook may drain from the main thread while the flusher runs; none of it while a CUDA graph
        # capture is open (any device call would invalidate it: probe/capturegate.py), the next pass catches up
        with self._drain_lock, GATE.device_work() as free:
            if free:
                self._drain_locked(final)

    def _drain_locked(self, final: bool) -> None:
        # Device copies finish in launch order, so stop at the first one not yet done. Only this thread
        # removes from `_inflight` and only from its head; the training thread only appends to its tail.
        if self._device_broken:
            return
        snapshot = list(self._inflight)
        try:
            self._prepare(snapshot, final)
        except Exception as exc:
            self.abandon_device(exc)
            return
        done = 0
        for rec, packs in paced(snapshot, enabled=not final, stop=self.ending):
            try:
                if not final and (GATE.capturing or (packs and not all(p.ready() for p in packs))):
                    break  # not done yet, or a capture waits for this pass to end
                if final and not self._wait_for_device_copies(packs):
                    raise RuntimeError("a device copy cannot be waited for")
            except Exception as exc:
                self.abandon_device(exc)
                return
            pairs: list[tuple[str, float]] = []
            for p in packs:
                pairs.extend(p.pairs())
            row = self._row(rec, pairs)
            if self._ring.items and _nonfinite_row(row):
                micro = row.get("micro") or 0
                row["extra"]["nonfinite_batch"] = self._ring.save(self.run_dir, row["step"],
                                                                  micro - self.grad_accum + 1, micro)
            self._writer.add_step(row)
            if rec.get("memory"):
                self._writer.add_event(EVENT_SAMPLE, "memory", rec["memory"], step=row["step"])
            done += 1
            for fn in self._observers:
                try:
                    fn(row)
                except Exception as exc:
                    self.fail("observer", exc)
        del self._inflight[:done]
        if not final:
            breathe(self.ending)  # (the rest is a stretch of its own)
        self._drain_experts(final)
        if self._contracts is not None:
            self._contracts.drain(final)
        moved = collectives.changed()
        if moved is not None:
            self._writer.set_meta(f"collectives.{self.rank}", moved)
        if self._flight_thread is None:
            self._answer_flight()  # (a process that is one rank of several answers from its own thread)
        beat = (self.progress_time(), self.micro, self.step_count, self.phases.current,
                BEAT_FINISHED if self.finished else BEAT_RUNNING)
        now = time.time()
        if beat != self._last_beat or now - self._last_beat_t >= BEAT_REFRESH:
            # Only when it says something new (or to refresh its flush time now and then): an unchanged
            # heartbeat cost a commit at every flush of a run that waits (an evaluation, the pause between
            # two blocks of a benchmark), and nobody reads more from it than progress.
            self._last_beat, self._last_beat_t = beat, now
            t_progress, micro, step, phase, state = beat
            self._writer.set_heartbeat(t_progress=t_progress, micro=micro, step=step, phase=phase, state=state)

    def start_flight_answers(self) -> None:
        """Once this process is one rank of several, the watchdog's flight-recorder requests are answered by a
        thread of their own (`_answer_flight_loop`), started here (the flusher asks before each pass's
        drain); until then the drain answers them. Why a thread: the drain stacks and copies device values,
        and under NCCL a collective that cannot complete wedges the GPU; the launches queued behind it fill
        the device's queue and the next launch blocks. A new user's DDP job with a `dist.barrier()` under
        `if rank == 0:` hung so, both ranks' background threads in `torch.stack`, and no rank answered: the
        watchdog named no rank and no collective. The answer launches nothing and waits for nothing on the
        device: NCCL's recorder queries its CUDA events, which returns at once on a wedged GPU
        (benchmarks/nccl_wedged_read.py)."""
        if self._flight_thread is not None or not flightrec.distributed():
            return
        thread = threading.Thread(target=self._answer_flight_loop, name="trainguard-flightrec", daemon=True)
        self._flight_thread = thread
        thread.start()

    def _answer_flight_loop(self) -> None:
        """The flight-recorder thread: one stat every FLIGHT_POLL_S, an answer committed when asked. It goes on
        past the flusher's end, until the last drain is over (`flight_done`): that drain waits for the lock
        a flusher held up by a wedged GPU never gives back, and then only this thread answers. None while a
        CUDA graph capture is open (the recorder's event queries could invalidate it). Its errors are logged
        once, never counted toward switching the guard off (a store it cannot write would do so in seconds)."""
        while not self.flight_done.wait(FLIGHT_POLL_S):
            if GATE.capturing:
                continue
            try:
                self._answer_flight(commit=True)
            except Exception as exc:
                self._selflog.once("flight recorder thread", f"flight recorder's answer failed: {exc!r}")

    def _answer_flight(self, commit: bool = False) -> None:
        """A stall: the watchdog asks what the flight recorder knows (one stat when it has not asked).
        `commit`: written to the store at once (the background thread, which commits, has stopped)."""
        asked = flightrec.asked(self.run_dir)
        if asked is not None:
            answer = flightrec.answer(asked, step=self.step_count + 1)
            # the counters as they are now: the background thread that copies them may be held (a wedged
            # GPU), and with the recorder off they are all the watchdog has
            answer["position"] = collectives.position()
            answer["attempt"] = self._writer.attempt  # (a restarted run's answers of an earlier attempt stay in meta)
            self._writer.set_meta(f"{FLIGHT_ANSWER_PREFIX}{self.rank}", answer)
            if commit:
                self._writer.flush()

    def _wait_for_device_copies(self, packs: list[Any]) -> bool:
        """The last drain's wait for copies still in flight; False when one cannot be waited for (a sticky
        device error). It polls, never blocks: under NCCL a collective that cannot complete shows up here,
        since every rank's host runs on to `guard.finish()` and waits for its device, and the watchdog then
        asks each rank's flight recorder where its device waits, which the stopped background thread no
        longer answers. The watchdog knows this function by its name (contract.PROBE_DEVICE_WAIT)."""
        pause = DEVICE_POLL_FIRST
        answering = self._flight_thread is None  # (a rank of several: its own thread answers until this is over)
        for p in packs:
            while True:
                try:
                    if p.ready():
                        break
                except Exception:
                    return False
                if answering:
                    try:
                        self._answer_flight(commit=True)
                    except Exception as exc:  # (the store's, not the device's: the copies' rows still count)
                        answering = False
                        self.fail("flight recorder's answer", exc)
                time.sleep(pause)
                pause = min(DEVICE_POLL_MAX, 2 * pause)
        return True

    def _prepare(self, snapshot: list[tuple[dict[str, Any], Any]], final: bool = False) -> None:
        """Background thread: GPU steps handed over since the last pass are stacked on the stream they were
        made on (each step's values, one launch), their version counters read again (a value changed in
        place since the step is dropped, never read wrong), and the vectors stacked here or by the training
        thread (`Staged`) copied to the host together, one copy per device and stream. Entries are replaced
        in place: the training thread only appends to `_inflight`."""
        staged: list[tuple[int, int]] = []  # (entry, position in its packs) of each Staged
        vectors: list[devicestats.Staged] = []
        deferred: dict[Any, list[int]] = {}  # GPU steps left for this thread to stack, by stream
        for i, (rec, packs) in enumerate(snapshot):
            if packs is devicestats.DEFERRED:
                deferred.setdefault(rec.pop("stream"), []).append(i)
                continue
            for j, p in enumerate(packs):
                if isinstance(p, devicestats.Staged):
                    staged.append((i, j))
                    vectors.append(p)
        for stream, entries in deferred.items():
            with devicestats.on_stream(stream):
                for i in paced(entries, enabled=not final, stop=self.ending):
                    rec = snapshot[i][0]
                    pending, weights, fresh = rec.pop("pending", ()), rec.pop("weights", None), rec.pop("weights_fresh", False)
                    opt_tensors = rec.pop("opt_tensors", ())
                    try:
                        packs, rec["floats"] = devicestats.stage_step(pending, weights, fresh, opt_tensors)
                        # read after the stack's launch: a change launched before it moved the counter by now
                        if devicestats.versions(pending, weights, fresh, dims=False) != rec.pop("versions"):
                            self._changed_in_place(rec["step"])
                            packs, rec["floats"] = devicestats.stage_step((), None, False, opt_tensors)
                    except Exception as exc:  # the row goes without the step's values
                        if devicestats.is_device_error(exc):
                            raise  # a sticky device error: every copy in flight is abandoned, once (`_drain_locked`)
                        self.fail("step values", exc)
                        packs, rec["floats"] = [], {}
                    snapshot[i] = self._inflight[i] = (rec, packs)
                    for j, p in enumerate(packs):
                        if isinstance(p, devicestats.Staged):
                            staged.append((i, j))
                            vectors.append(p)
        if vectors:
            for (i, j), p in zip(staged, devicestats.copy_staged(vectors)):
                snapshot[i][1][j] = p

    def _changed_in_place(self, step: int) -> None:
        """A value the loop gave for GPU step `step` changed in place before this thread stacked it: the
        step's values are dropped (a row without its loss, never a wrong number), and from now on the values
        are stacked on the training thread as each step closes."""
        if not self._stage_here:
            self._stage_here = True
            self._selflog.write(f"a value given to guard.step for step {step} was changed in place before it was "
                                f"read (an accumulator reused?): that step's losses are not recorded, and later "
                                f"steps are read as they close")

    def abandon_device(self, exc: BaseException) -> None:
        """The device is in a sticky error state (a device-side assert, an illegal access): every copy still
        in flight is unreadable. Drop them without waiting, and never free them: freeing pinned blocks and
        events after such an error can throw inside a C++ destructor and abort the process, which would
        turn the user's clean crash (exit 1, a traceback) into a SIGABRT."""
        self._device_broken = True
        self.fail("device copies abandoned", exc)
        abandoned = [self._inflight[:], self._experts_inflight[:], self.update_snapshot]
        self._inflight.clear()
        self._experts_inflight.clear()
        self.update_snapshot = None
        _keep_forever(abandoned)

    def _drain_experts(self, final: bool) -> None:
        done = 0
        for step, layer, host, event in list(self._experts_inflight):
            try:
                if event is not None and not final and not event.query():
                    break  # copies finish in order
                if event is not None and final:
                    event.synchronize()
            except Exception as exc:
                self.abandon_device(exc)
                return
            load = host.tolist() if is_tensor(host) else [float(v) for v in host]
            self._writer.add_event(EVENT_EXPERTS, None if layer is None else str(layer),
                                   {"layer": None if layer is None else str(layer), "load": load}, step=step)
            done += 1
        self._experts_inflight[:done] = []

    def _row(self, rec: dict[str, Any], pairs: list[tuple[str, float]]) -> dict[str, Any]:
        """One steps-table row from a record and its resolved device values (micro-batches averaged)."""
        collected: dict[str, list[float]] = {}
        for name, value in pairs:
            collected.setdefault(name, []).append(value)
        for name, vs in rec.get("floats", {}).items():
            collected.setdefault(name, []).extend(vs)
        values = {name: vs[-1] for name, vs in collected.items()}
        loss_vals = collected.get("loss", [])
        parts = {n[5:]: _mean(vs) for n, vs in collected.items() if n.startswith("part:")}
        device_weights = {n[7:]: vs[-1] for n, vs in collected.items() if n.startswith("weight:")}
        extra: dict[str, Any] = {n[2:]: vs[-1] for n, vs in collected.items() if n.startswith("x:")}
        for name, (start, end) in rec.get("intervals", {}).items():
            seconds = devicestats.elapsed(start, end)
            if seconds is not None:
                extra[name[2:]] = seconds
        if rec.get("lrs"):
            extra["lrs"] = rec["lrs"]
        if rec.get("no_grad"):
            extra["params_without_grad"] = rec["no_grad"]
            if rec.get("checkpoint_no_grad"):
                extra["checkpoint_inputs_no_grad"] = True
        if rec.get("clock"):
            extra.update(rec["clock"])  # cpu_s, run_wait_s, proc_cpu_s, others_cores (probe/schedclock.py)
        if rec.get("incomplete"):
            extra["incomplete"] = True
            if self._uses_step and self.optimizer is not None and not rec.get("opt_done"):
                extra["optimizer_step_skipped"] = True
        grad_norm = values.get("grad_norm")
        row = {
            "kind": "step",  # the rules' event kind (the store ignores it)
            "step": rec["step"],
            "t": rec.get("t") or time.time(),
            "micro": rec.get("micro"),
            "loss": _mean(loss_vals) if loss_vals else None,
            "lr": values.get("lr", rec.get("lr")),
            "grad_norm": grad_norm,
            "update_ratio": values.get("update_ratio"),
            "nonfinite": (0 if math.isfinite(grad_norm) else 1) if grad_norm is not None else None,
            "step_time": rec.get("step_time"),
            "data_wait": rec.get("data_wait"),
            # the loss side's (read at guard.step, this row's own step) before the optimizer side's: after a
            # step the GradScaler skipped, the next optimizer step's record is merged into this row
            "loss_scale": collected["loss_scale"][0] if collected.get("loss_scale") else None,
            "sched_epoch": rec.get("sched_epoch"),
            "parts": parts,
            "weights": {**(rec.get("weights") or {}), **device_weights},
            "extra": extra,
        }
        self._summary = {"step": row["step"], "loss": row["loss"], "lr": row["lr"]}
        return row

    # -- the guard's own errors ----------------------------------------------------------------------

    def fail(self, where: str, exc: BaseException) -> None:
        """One of the guard's own errors: logged (de-duplicated), and counted toward switching itself off."""
        self._errors += 1
        self._selflog.error(where, exc)
        if self._errors >= MAX_GUARD_ERRORS and not self._disabled:
            self._disabled = True
            self._selflog.write(f"too many errors ({self._errors}): the guard switched itself off")


def _nonfinite_row(row: dict[str, Any]) -> bool:
    values = [row.get("loss"), *(row.get("parts") or {}).values()]
    return any(isinstance(v, float) and not math.isfinite(v) for v in values)


def _keep_forever(obj: Any) -> None:
    """Make `obj` never be freed, not even at interpreter shutdown (see `StepRecorder.abandon_device`)."""
    import ctypes

    try:
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))
    except Exception:
        _FOREVER.append(obj)


_FOREVER: list[Any] = []


def _mean(values: list[float]) -> float | None:
    if not values:
        return None
    # plain sum: fsum raises on inf + -inf, and a NaN must stay a NaN here
    return sum(values) / len(values)
