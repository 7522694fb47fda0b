"""The probe's background half: finished device copies become step rows, fanned out and committed.

A thread of its own wakes every FLUSH_INTERVAL. Each pass drains the finished records the step assembler
(probe/steps.py) handed over (`Handoff`): GPU steps' values are stacked on the stream they were made on
(`devicestats.stage_step`), checked unchanged since they were given, copied to the host several steps at
once (`devicestats.copy_staged`) and, waiting for no copy, turned into rows for the store. Then it takes a
memory sample when no step brought one, commits the store (so a SIGKILL loses at most that fraction of a
second), writes the heartbeat when it says something new, notes store trouble in guard.log, and gives the
ending its turn (probe/alone.py: rules and status.json when no watchdog owns them). All of it deferred
while a CUDA graph capture is open (probe/capturegate.py). It never dies of an error: a dead drain would
silently stop recording.

The drain knows the assembler only through the hand-off; it is driven alone in tests/test_drain.py.
"""

from __future__ import annotations

import math
import threading
import time
from pathlib import Path
from typing import Any

from trainguard.contract import BEAT_FINISHED, BEAT_RUNNING, EVENT_EXPERTS, EVENT_SAMPLE
from trainguard.probe import collectives, devicestats
from trainguard.probe.capturegate import GATE
from trainguard.probe.flightanswers import FlightResponder
from trainguard.probe.handoff import Handoff
from trainguard.probe.pacing import begin_pass, breathe, paced, pass_elapsed, resting
from trainguard.probe.state import ProbeState
from trainguard.store.writer import StoreWriter

# Seconds between commits: bounds what a SIGKILL can lose. Every wake of this thread has a fixed cost
# beside its rows (taking the interpreter lock back from the training thread, cold caches, a commit): at
# 0.2 s it was a third of the thread's CPU in a CPU-bound loop (issue 21); the watchdog looks every 0.5 s.
FLUSH_INTERVAL = 0.5
MIN_WAIT = 0.05  # seconds between the end of a pass and the next, however long the pass took
BEAT_REFRESH = 5.0  # seconds: an unchanged heartbeat is written again after this long (its t_flush)
# seconds between looks at a device copy the last drain waits for: at once, then doubling up to 50 ms
DEVICE_POLL_FIRST = 0.0005
DEVICE_POLL_MAX = 0.05


class _Quiet:
    """The ending's turn when there is none (a drain driven alone): nothing."""

    def tick(self) -> None:
        pass


class Drain:
    """The background thread: the hand-off's records become rows in the store, a few times a second."""

    def __init__(self, state: ProbeState, handoff: Handoff, writer: StoreWriter, *, run_dir: Path, rank: int,
                 grad_accum: int, ring: Any, memory: Any, phases: Any) -> None:
        self.state = state
        self.handoff = handoff
        self.writer = writer
        self.run_dir = run_dir
        self.rank = rank
        self.grad_accum = grad_accum
        self.ring = ring  # recent batches (probe/replay.py): the one that made a NaN is saved beside its row
        self.memory = memory  # the memory sampler (probe/samples.py): a sample when no step brought one
        self.phases = phases  # the heartbeat names the phase
        self.flight = FlightResponder(state, writer, run_dir, rank)
        self.contracts: Any = None  # the contract checks, once attached: their findings drained each pass
        self.ending: Any = _Quiet()  # the standalone ending (probe/alone.py) or `Watched`: its turn each pass
        self.summary: dict[str, Any] = {"step": 0, "loss": None, "lr": None}  # the last row's, for status.json
        self.stopping = threading.Event()  # the run is ending: the loop ends, paced work stops pausing
        self.lock = threading.Lock()  # the crash hook may drain from the main thread while the loop runs
        self._last_beat: tuple[Any, ...] | None = None  # the heartbeat last queued (without its flush time), and when
        self._last_beat_t = 0.0
        self._thread = threading.Thread(target=self._loop, name="trainguard-probe", daemon=True)

    # -- the thread ------------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Ends the loop (and waits up to `timeout` for its pass in progress); `None`: does not wait."""
        self.stopping.set()
        if timeout is not None and self._thread.is_alive():
            self._thread.join(timeout=timeout)

    def _loop(self) -> None:
        s, w, stop = self.state, self.writer, self.stopping

        def pause() -> None:
            breathe(stop)

        wait = FLUSH_INTERVAL
        while not stop.wait(wait):
            # One pass, paced (probe/pacing.py): a pause may come between its parts and inside the long
            # ones, so no stretch of it holds the interpreter lock from the training thread for long.
            # The next pass begins FLUSH_INTERVAL after this one began (the pauses do not stretch the
            # commit interval, what a SIGKILL can lose), at least MIN_WAIT after this one ends.
            try:
                begin_pass()
                self.flight.start()  # (before the drain, which a wedged GPU can hold)
                self.drain()
                pause()
                self.memory.background(s.step_count)
                w.flush(pause=pause)
                pause()
                self._log_store_trouble()
                self.ending.tick()
                resting()
            except Exception as exc:
                # Why not let it die: a dead drain would silently stop recording the run.
                s.fail("background flush", exc)
            wait = max(MIN_WAIT, FLUSH_INTERVAL - pass_elapsed())

    def _log_store_trouble(self) -> None:
        w, log = self.writer, self.state.selflog
        if w.last_error and w.failed_flushes in (1, 10, 100, 1000):
            log.write(f"store not written ({w.failed_flushes} tries, rows kept for the next): {w.last_error}")
        for line in GATE.errors:
            log.once(line, line)
        if w.refused:
            log.once("store refused rows", f"store refused a row, dropped ({w.refused} so far; later "
                     f"ones only counted): {w.first_refusal}")

    # -- one pass: device copies become rows -------------------------------------------------------------

    def drain(self, final: bool = False) -> None:
        """Finished device copies become step rows in the store (all of them, waited for, when `final`)."""
        # the crash hook may drain from the main thread while the loop runs; none of it while a CUDA graph
        # capture is open (any device call would invalidate it: probe/capturegate.py), the next pass catches up
        with self.lock, GATE.device_work() as free:
            if free:
                self._drain_locked(final)

    def _drain_locked(self, final: bool) -> None:
        # Device copies finish in launch order, so stop at the first one not yet done. Only this thread
        # removes from the hand-off and only from its head; the training thread only appends to its tail.
        if self.state.device_broken:
            return
        inflight = self.handoff.steps
        snapshot = list(inflight)
        try:
            self._prepare(snapshot, final)
        except Exception as exc:
            self.abandon_device(exc)
            return
        done = 0
        for rec, packs in paced(snapshot, enabled=not final, stop=self.stopping):
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
            row = self.row(rec, pairs)
            if self.ring.items and _nonfinite_row(row):
                micro = row.get("micro") or 0
                row["extra"]["nonfinite_batch"] = self.ring.save(self.run_dir, row["step"],
                                                                 micro - self.grad_accum + 1, micro)
            self.writer.add_step(row)
            if rec.get("memory"):
                self.writer.add_event(EVENT_SAMPLE, "memory", rec["memory"], step=row["step"])
            done += 1
        del inflight[:done]
        if not final:
            breathe(self.stopping)  # (the rest is a stretch of its own)
        self._drain_experts(final)
        if self.contracts is not None:
            self.contracts.drain(final)
        moved = collectives.changed()
        if moved is not None:
            self.writer.set_meta(f"collectives.{self.rank}", moved)
        if self.flight.thread is None:
            self.flight.answer()  # (a process that is one rank of several answers from its own thread)
        self._heartbeat()

    def _heartbeat(self) -> None:
        s = self.state
        beat = (s.progress_time(), s.micro, s.step_count, self.phases.current,
                BEAT_FINISHED if s.finished else BEAT_RUNNING)
        now = time.time()
        if beat != self._last_beat or now - self._last_beat_t >= BEAT_REFRESH:
            # Only when it says something new (or to refresh its flush time now and then): an unchanged
            # heartbeat cost a commit at every flush of a run that waits (an evaluation, the pause between
            # two blocks of a benchmark), and nobody reads more from it than progress.
            self._last_beat, self._last_beat_t = beat, now
            t_progress, micro, step, phase, state = beat
            self.writer.set_heartbeat(t_progress=t_progress, micro=micro, step=step, phase=phase, state=state)

    def _wait_for_device_copies(self, packs: list[Any]) -> bool:
        """The last drain's wait for copies still in flight; False when one cannot be waited for (a sticky
        device error). It polls, never blocks: under NCCL a collective that cannot complete shows up here,
        since every rank's host runs on to `guard.finish()` and waits for its device, and the watchdog then
        asks each rank's flight recorder where its device waits, which the stopped background thread no
        longer answers. The watchdog knows this function by its name (contract.PROBE_DEVICE_WAIT)."""
        pause = DEVICE_POLL_FIRST
        answering = self.flight.thread is None  # (a rank of several: its own thread answers until this is over)
        for p in packs:
            while True:
                try:
                    if p.ready():
                        break
                except Exception:
                    return False
                if answering:
                    try:
                        self.flight.answer(commit=True)
                    except Exception as exc:  # (the store's, not the device's: the copies' rows still count)
                        answering = False
                        self.state.fail("flight recorder's answer", exc)
                time.sleep(pause)
                pause = min(DEVICE_POLL_MAX, 2 * pause)
        return True

    def _prepare(self, snapshot: list[tuple[dict[str, Any], Any]], final: bool = False) -> None:
        """GPU steps handed over since the last pass are stacked on the stream they were made on (each
        step's values, one launch), their version counters read again (a value changed in place since the
        step is dropped, never read wrong), and the vectors stacked here or by the training thread
        (`Staged`) copied to the host together, one copy per device and stream. Entries are replaced in
        place: the training thread only appends to the hand-off."""
        inflight = self.handoff.steps
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
                for i in paced(entries, enabled=not final, stop=self.stopping):
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
                        self.state.fail("step values", exc)
                        packs, rec["floats"] = [], {}
                    snapshot[i] = inflight[i] = (rec, packs)
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
        if not self.handoff.stage_here:
            self.handoff.stage_here = True
            self.state.selflog.write(f"a value given to guard.step for step {step} was changed in place before it "
                                     f"was read (an accumulator reused?): that step's losses are not recorded, and "
                                     f"later steps are read as they close")

    def abandon_device(self, exc: BaseException) -> None:
        """A sticky device error: every copy in flight is dropped, never freed (`Handoff.abandon`)."""
        self.handoff.abandon(self.state, exc)

    def _drain_experts(self, final: bool) -> None:
        inflight = self.handoff.experts
        done = 0
        for step, layer, host, event in list(inflight):
            try:
                if event is not None and not final and not event.query():
                    break  # copies finish in order
                if event is not None and final:
                    event.synchronize()
            except Exception as exc:
                self.abandon_device(exc)
                return
            load = host.tolist() if devicestats.is_tensor(host) else [float(v) for v in host]
            self.writer.add_event(EVENT_EXPERTS, None if layer is None else str(layer),
                                  {"layer": None if layer is None else str(layer), "load": load}, step=step)
            done += 1
        inflight[:done] = []

    def row(self, rec: dict[str, Any], pairs: list[tuple[str, float]]) -> dict[str, Any]:
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
            if rec.get("opt_skipped"):  # (the assembler says: a loop of guard.step, an optimizer, no step of it)
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
        self.summary = {"step": row["step"], "loss": row["loss"], "lr": row["lr"]}
        return row


def _nonfinite_row(row: dict[str, Any]) -> bool:
    values = [row.get("loss"), *(row.get("parts") or {}).values()]
    return any(isinstance(v, float) and not math.isfinite(v) for v in values)


def _mean(values: list[float]) -> float | None:
    if not values:
        return None
    # plain sum: fsum raises on inf + -inf, and a NaN must stay a NaN here
    return sum(values) / len(values)
