"""The probe without its public face: the parts of a guard wired together, started and ended.

`Probe` is what the automatic probe (probe/auto.py) makes at a script's first optimizer step: the step
assembler with the optimizer's hooks, the store, the drain (the background thread), the crash hook and the
ending, and nothing a script calls. `Guard` (probe/guard.py) is a Probe with the public API on top.

The parts share one `ProbeState` (probe/state.py) and meet only through it and the hand-off
(probe/handoff.py): the assembler (probe/steps.py) fills the hand-off on the training thread, the drain
(probe/drain.py) empties it on its own.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from trainguard.contract import ENV_ATTEMPT, ENV_RUN_DIR, ENV_WATCHDOG, EVENT_PROBE
from trainguard.probe import (
    capturegate,
    ckptverify,
    collectives,
    contracts,
    crashhook,
    fastforward,
    stackdump,
    syncwait,
)
from trainguard.probe.alone import Alone, Watched
from trainguard.probe.drain import Drain
from trainguard.probe.handoff import Handoff
from trainguard.probe.opthooks import OptimizerHooks
from trainguard.probe.startrecord import record_start
from trainguard.probe.state import ProbeState
from trainguard.probe.steps import StepRecorder
from trainguard.store import lock as run_lock
from trainguard.store.paths import new_run_dir, prepare_run_dir
from trainguard.store.ranks import launched_alone, rank_info
from trainguard.store.selflog import GuardLog
from trainguard.store.writer import StoreWriter


class Probe(StepRecorder):
    """One training process's recording: made by `Guard` (the script's `watch()`) or by the automatic probe."""

    def __deepcopy__(self, memo: dict) -> Probe:
        # A model is deep-copied with its hooks (an EMA copy, Ultralytics' trainer, copy.deepcopy(model));
        # the hooks are bound to the process's one guard, which must be shared, never copied (it holds locks).
        return self

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        from trainguard.probe.detached import Detached

        return (Detached, ())  # a pickled model's hooks carry no guard (probe/detached.py says why)

    def __init__(
        self,
        model: Any = None,
        optimizer: Any = None,
        scheduler: Any = None,
        *,
        total_steps: int | None = None,
        grad_accum: int = 1,
        scaler: Any = None,
        run_dir: str | os.PathLike | None = None,
        name: str | None = None,
        config: dict | None = None,
        stats_every: int = 10,
        auto: bool = False,
        learning: bool = True,
    ) -> None:
        if grad_accum < 1:
            raise ValueError(f"trainguard.watch: grad_accum must be >= 1, got {grad_accum}")
        if total_steps is not None and total_steps < 1:
            raise ValueError(f"trainguard.watch: total_steps must be >= 1 or None, got {total_steps}")
        self.model = model
        self.scheduler = scheduler
        self.learning = learning  # False: a job that runs a model without training it (the plan says so)
        self.auto = auto  # made by the automatic probe (probe/auto.py) at the first optimizer step
        self.place = rank_info()  # rank, node and host from torchrun's (or Slurm's) environment
        self.attempt = int(os.environ.get(ENV_ATTEMPT, "0") or 0)
        self.under_watchdog = bool(os.environ.get(ENV_WATCHDOG))
        self._t0 = time.time()
        rank = self.place["rank"]
        label = name or (Path(sys.argv[0]).stem if sys.argv and sys.argv[0] else "python")
        if run_dir is not None:
            folder = prepare_run_dir(Path(run_dir))
        elif os.environ.get(ENV_RUN_DIR):
            folder = prepare_run_dir(os.environ[ENV_RUN_DIR])
        else:
            folder = new_run_dir(label)
        # a script run alone owns its folder like a watchdog does (store/lock.py): a second run into it is
        # refused; an earlier run found there is kept apart (one rank alone: other ranks may be writing)
        self._run_lock = run_lock.claim(folder, keep_apart=launched_alone()) \
            if not self.under_watchdog and rank == 0 else None
        self.run_dir = folder
        self.rank = rank
        self.selflog = GuardLog(folder, rank, stderr_fallback=True)
        self.state = ProbeState(self.selflog)
        self.handoff = Handoff()
        self.writer = StoreWriter(folder, rank=rank, attempt=self.attempt)
        StepRecorder.__init__(
            self, self.state, self.handoff, self.writer, grad_accum=int(grad_accum), total_steps=total_steps,
            stats_every=max(1, int(stats_every)), optimizer=optimizer, scaler=scaler)
        self.drainer = Drain(self.state, self.handoff, self.writer, run_dir=folder, rank=rank,
                            grad_accum=self.grad_accum, ring=self.ring, memory=self.memory, phases=self.phases)
        self._verifier: Any = None  # made at the first reported checkpoint (probe/ckptverify.py)
        # the ending is chosen once: the probe's own when no watchdog owns it (rank 0 only), else nothing
        alone = not self.under_watchdog and rank == 0
        self._ending = Alone(self, environ=os.environ, t0=self._t0, attempt=self.attempt) if alone else Watched()
        self.drainer.ending = self._ending
        self._ending.start(record_start(self.writer, self, pid=self.pid, label=label, config=config))
        # preflight's mode, or the do-nothing default (before the hooks: it copies the scheduler)
        self.fast_forward = fastforward.from_env(self, self.writer, self.selflog.write)
        self._hooks = OptimizerHooks(self.state, self, model=model, scheduler=scheduler)
        self._hooks.install()
        collectives.install()  # each collective numbered per group, for the hang diagnosis across ranks
        try:  # API-contract checks (probe/contracts.py): hooks of their own, fail-open like the rest
            self.contracts = contracts.attach(self)
        except Exception as exc:
            self.contracts = None
            self.fail("contract checks", exc)
        self.drainer.contracts = self.contracts
        if self.contracts is None or self.contracts.module is None or self.contracts.module is not model:
            self._hooks.install_marker()  # (else the checks' forward pre-hook counts each forward as progress)
        try:  # per rank, the time a step works before it synchronises (TG703 straggler-rank), fail-open
            self._syncwait = syncwait.attach(self)
        except Exception as exc:
            self._syncwait = None
            self.fail("sync-wait measure", exc)
        # CUDA graph captures: the background thread and the hooks stay off the device during one (fail-open)
        capturegate.install()
        self.drainer.start()
        self._devices = self._start_devices()  # GPU telemetry off the training thread (devices/), fail-open
        crashhook.install(self)
        os.register_at_fork(after_in_child=self._after_fork_in_child)
        stackdump.install(self.run_dir)  # stacks on a signal, for the watchdog's hang diagnosis (fail-open)
        import atexit

        atexit.register(self._at_exit)

    # -- what the parts read of the probe as a whole ---------------------------------------------------

    @property
    def finished(self) -> bool:
        """`finish()` ran."""
        return self.state.finished

    @property
    def crashed(self) -> bool:
        """An uncaught exception (or Ctrl-C) ended the script, and was recorded."""
        return self.state.crashed

    @property
    def summary(self) -> dict[str, Any]:
        """The last step row's step, loss and LR (for status.json)."""
        return self.drainer.summary

    @property
    def ending(self) -> Any:
        """Set once the run is ending: paced background work stops pausing (probe/pacing.py)."""
        return self.drainer.stopping

    def fail(self, where: str, exc: BaseException) -> None:
        """One of the guard's own errors: logged, counted toward switching itself off (`ProbeState.fail`)."""
        self.state.fail(where, exc)

    def drain(self, final: bool = False) -> None:
        """Finished device copies become step rows in the store (all of them, waited for, when `final`)."""
        self.drainer.drain(final)

    def abandon_device(self, exc: BaseException) -> None:
        """A sticky device error: every device copy in flight is dropped, never freed (`Handoff.abandon`)."""
        self.handoff.abandon(self.state, exc)

    # -- the run's end ----------------------------------------------------------------------------------

    def finish(self) -> None:
        """The script reached its end: flush everything and mark the probe finished.

        Also when the guard switched itself off after errors of its own: the run did end, and saying so
        is what keeps a completed run from being reported as failed.
        """
        if self.finished or os.getpid() != self.pid:
            return
        self.state.finished = True
        crashhook.forget(self)  # a later crash of another guard in this process is not this run's
        self._settle_verifier(ckptverify.FINISH_WAIT)  # the last checkpoint's verdict, before the ending
        self._stop_devices()
        self._sched.close()
        try:
            if not self.state.disabled:
                self.emit_all()
            self.writer.add_event(EVENT_PROBE, "finish", {"steps": self.step_count, "micro": self.micro,
                                                           "guard_disabled": self.state.disabled}, step=self.step_count)
            self.drainer.stop(timeout=5.0)
            if not self.state.disabled:
                self.drainer.drain(final=True)
            self.drainer.flight.done.set()
            self.writer.flush()
            self._ending.finished()
        except Exception as exc:
            self.fail("finish", exc)

    def record_crash(self, exc_type: type, exc: BaseException, tb: Any) -> None:
        """Called by the crash hook: records the exception with the step and phase it happened in."""
        if os.getpid() != self.pid:
            return
        try:
            crashhook.record(self, self._ending, self._t0, exc_type, exc, tb)
        except Exception as exc2:
            self.fail("crash record", exc2)

    def record_interrupt(self) -> None:
        """Called by the crash hook (and the CLI) on a KeyboardInterrupt: the run was interrupted, it did not
        forget `finish()`; what it recorded is flushed and the ending says so."""
        if self.finished or self.crashed or os.getpid() != self.pid:
            return
        self.state.crashed = True  # the ending is written here: interpreter exit adds no probe-not-finished
        try:
            self.emit_all()
            self.drainer.drain(final=True)
            self.writer.flush()
            self._ending.interrupted()
        except Exception as exc:
            self.fail("interrupt record", exc)

    def retire(self) -> None:
        """The automatic probe steps aside for the script's own guard: its hooks come off, it stops recording."""
        self._hooks.remove_optimizer_hooks()
        self._stop_devices(wait=0.0)  # the script's guard samples the GPU from now on (its threads end alone)
        self.writer.add_event(EVENT_PROBE, "auto-retired", {"steps": self.step_count})
        self.writer.flush()
        self.state.disabled = True
        self.drainer.stop()
        self.drainer.flight.done.set()
        crashhook.forget(self)

    def _after_fork_in_child(self) -> None:
        # A forked DataLoader worker inherits this object but not its thread, and must never touch the
        # parent's SQLite connection: the guard goes quiet in the child.
        self.state.disabled = True

    def verify_checkpoint(self, path: Path) -> None:
        """Hands a reported checkpoint to the verifier (a deque append; the work is a child process's)."""
        if self.state.disabled or not ckptverify.enabled():
            return
        if self._verifier is None:
            self._verifier = ckptverify.make(self.writer, self.selflog, self.learning)
        self._verifier.submit(path, self.step_count, rank=self.rank)

    def _start_devices(self) -> Any:
        try:
            from trainguard.devices import sampler

            if not sampler.enabled():
                return None
            return sampler.DeviceSampler(self.writer, rank=self.rank, local_rank=self.place["local_rank"],
                                         log=self.selflog.write, step_of=lambda: self.step_count).start()
        except Exception as exc:
            self.fail("device telemetry", exc)
            return None

    def _stop_devices(self, wait: float = 2.0) -> None:
        devices, self._devices = getattr(self, "_devices", None), None
        if devices is not None:
            try:
                devices.stop(timeout=wait)
            except Exception as exc:
                self.fail("device telemetry", exc)

    def _settle_verifier(self, timeout: float) -> None:
        if self._verifier is not None:
            try:
                if not self._verifier.settle(timeout):
                    self.selflog.write(f"the last checkpoint's verification did not end within {timeout:.0f} s")
                self._verifier.stop()
            except Exception as exc:
                self.fail("checkpoint verification", exc)

    def _at_exit(self) -> None:
        if os.getpid() != self.pid:
            return
        # an exit without finish() lets the last verification end (bounded); a crash or Ctrl-C does not wait
        self._settle_verifier(0.0 if self.crashed else ckptverify.EXIT_WAIT)
        self._stop_devices()
        try:
            if not self.state.disabled:
                self.emit_all()
            self.drainer.stop(timeout=2.0)
            if not self.state.disabled:
                self.drainer.drain(final=True)
            self.writer.add_event(EVENT_PROBE, "exit", {"finished": self.finished, "crashed": self.crashed})
            self.drainer.flight.done.set()
            self.writer.flush()
            self._ending.exited()
            self.writer.close()
            if self.writer.unstored:  # steps the store never took are counted and said, never lost in silence
                self.selflog.write(f"{self.writer.unstored}; the training itself went on to step {self.step_count}")
        except Exception as exc:
            self.fail("exit", exc)

