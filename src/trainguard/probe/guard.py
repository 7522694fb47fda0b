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

The hot path (`step`, `batches`, the optimizer hooks) appends to lists and launches a few tiny kernels;
it never reads a number back from the device. A background thread turns finished device copies into
rows and commits them to the run store a few times a second. Every public method catches its own errors:
a broken guard logs to `guard.log` in the run folder and steps aside, it never breaks the training loop.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import threading
import time
import traceback
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from trainguard.contract import ENV_ATTEMPT, ENV_RESUME_FROM, ENV_RULES, ENV_RUN_DIR, ENV_WATCHDOG
from trainguard.probe import collectives, contracts, devicestats, planinfo, samples, stackdump, syncwait
from trainguard.probe.pacing import paced
from trainguard.probe.replay import BatchRing
from trainguard.probe.schedclock import SchedClock
from trainguard.rules.ending import PROBE_NOT_FINISHED
from trainguard.store.paths import new_run_dir, prepare_run_dir
from trainguard.store.ranks import rank_info
from trainguard.store.selflog import GuardLog
from trainguard.store.status import reserve_space, write_status
from trainguard.store.writer import StoreWriter
from trainguard.untrusted import printable

FLUSH_INTERVAL = 0.2  # seconds between commits: bounds what a SIGKILL can lose
STATUS_INTERVAL = 1.0  # seconds between status.json rewrites when no watchdog owns it
RULES_INTERVAL = 1.0  # seconds between runs of the health rules when no watchdog runs them
# Memory is also sampled on the training thread as steps complete, so the memory rules see a leak within
# a share of the run however fast the steps are: at most this many samples over the planned run (and no
# closer than samples.MIN_STEP_SAMPLE_GAP seconds apart, which bounds the cost on a fast loop).
SAMPLES_PER_RUN = 1000
MAX_SAMPLE_EVERY = 20  # ...but at least one every 20 steps, so a long run's leak is seen within 200 steps
MAX_GUARD_ERRORS = 20  # past this many of its own errors the guard switches itself off


def _is_tensor(value: Any) -> bool:
    return type(value).__module__.startswith("torch") and hasattr(value, "detach")


class Guard:
    """Watches one training process. Make it with `trainguard.watch(...)`."""

    def __deepcopy__(self, memo: dict) -> Guard:
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
    ) -> None:
        if grad_accum < 1:
            raise ValueError(f"trainguard.watch: grad_accum must be >= 1, got {grad_accum}")
        if total_steps is not None and total_steps < 1:
            raise ValueError(f"trainguard.watch: total_steps must be >= 1 or None, got {total_steps}")
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.scaler = scaler
        self.total_steps = total_steps
        self.grad_accum = int(grad_accum)
        self.stats_every = max(1, int(stats_every))
        self.auto = auto  # made by the automatic probe (probe/auto.py) at the first optimizer step
        self.place = rank_info()  # rank, node and host from torchrun's (or Slurm's) environment
        self.rank = self.place["rank"]
        self.attempt = int(os.environ.get(ENV_ATTEMPT, "0") or 0)
        self.under_watchdog = bool(os.environ.get(ENV_WATCHDOG))
        self._pid = os.getpid()
        self._t0 = time.time()

        script = Path(sys.argv[0]).stem if sys.argv and sys.argv[0] else "python"
        label = name or script
        if run_dir is not None:
            self.run_dir = prepare_run_dir(run_dir)
        elif os.environ.get(ENV_RUN_DIR):
            self.run_dir = prepare_run_dir(os.environ[ENV_RUN_DIR])
        else:
            self.run_dir = new_run_dir(label)
        self._selflog = GuardLog(self.run_dir, self.rank, stderr_fallback=True)
        self._writer = StoreWriter(self.run_dir, rank=self.rank, attempt=self.attempt)

        # counters: micro-batches seen, optimizer steps seen by the hooks, steps closed by `step()`
        self.micro = 0
        self.opt_steps = 0
        self._loss_steps = 0
        self._uses_step = False
        self._records: dict[int, dict[str, Any]] = {}
        self._inflight: list[tuple[dict[str, Any], list[devicestats.DevicePack]]] = []
        self._pending: list[tuple[str, Any]] = []  # named tensors of the current step (device)
        self._pending_floats: dict[str, list[float]] = {}
        self._n_losses = 0
        self._weights: dict[str, float] = {}
        self._extra: dict[str, float] = {}
        self._data_wait = 0.0
        self._t_last_close: float | None = None
        self._sched = SchedClock()  # the training thread's CPU time and run-queue wait, every 8th step
        self._t_progress: float | None = None
        self._phases: list[str] = []
        self.phases_seen: dict[str, int] = {}
        self._due_last: dict[str, int] = {}
        self._exc_phase: tuple[BaseException, str, list[str]] | None = None
        self._device_broken = False
        self._cuda_index: int | None = None
        self._update_sample: list[Any] | None = None
        self._snapshot: Any = None
        self._errors = 0
        self._disabled = False
        self._step_thread: int | None = None  # the training thread: the first to call `step`
        self._thread_lock = threading.Lock()
        self._thread_refused = False
        self.finished = False
        self.crashed = False
        self._observers: list[Any] = []  # callables fed each resolved step row (online rules)
        self._last_status = 0.0
        self._summary: dict[str, Any] = {"step": 0, "loss": None, "lr": None}
        self._ring = BatchRing()  # recent batches from guard.batches, to save the one that made a NaN
        self._experts_inflight: list[tuple[int, Any, Any, Any]] = []
        self._experts_seen: set[tuple[int, Any]] = set()
        self._process = samples.own_process()
        self._last_sample = 0.0
        self._last_sample_step = 0
        self._sampling = True  # off after the first failure to read memory (logged once)
        self._rules_lock = threading.Lock()  # the background thread and an exit path may both run them
        self._rules: Any = None
        self._last_rules = 0.0
        self.rules_cpu = 0.0  # CPU seconds the probe's thread spent in the health rules
        # The findings status.json lists, as the store's reader would give them: read from the store once
        # (a resumed run folder may hold some already), then kept up to date by the rules pass that adds
        # them. Why not read them back at every status write: opening the store and parsing every finding,
        # once a second, held the interpreter lock long enough to stall the training thread.
        self._status_findings: dict[tuple, Any] | None = None

        from trainguard.store.owner import owner_record

        self._owner = owner_record(self._pid)  # status.json names its writer, so readers can tell it is gone
        if not self.under_watchdog and self.rank == 0:
            reserve_space(self.run_dir)  # the last status.json is written even if the run fills the disk
        self._write_meta(label, config)
        if not self.under_watchdog and self.rank == 0 and os.environ.get(ENV_RULES, "1") != "0":
            # Without a watchdog the probe runs the health rules itself, off the training thread, fed in
            # memory with what it queues for the store (before the hooks: they may queue an event).
            from trainguard.rules.live import InboxRules

            self._rules = InboxRules(self._plan, source="probe")
            self._writer.tap = self._rules.take
        from trainguard.probe import fastforward  # preflight mode only; None otherwise

        self._ff = fastforward.from_env(self)  # before the hooks: it copies the scheduler
        self._install_hooks()
        collectives.install()  # each collective numbered per group, for the hang diagnosis across ranks
        try:  # API-contract checks (probe/contracts.py): hooks of their own, fail-open like the rest
            self._contracts = contracts.attach(self)
        except Exception as exc:
            self._contracts = None
            self._fail("contract checks", exc)
        try:  # per rank, the time a step works before it synchronises (TG703 straggler-rank), fail-open
            self._syncwait = syncwait.attach(self)
        except Exception as exc:
            self._syncwait = None
            self._fail("sync-wait measure", exc)
        self._stop = threading.Event()
        self._drain_lock = threading.Lock()
        self._thread = threading.Thread(target=self._background, name="trainguard-probe", daemon=True)
        self._thread.start()
        _install_crash_hook(self)
        os.register_at_fork(after_in_child=self._after_fork_in_child)
        stackdump.install(self.run_dir)  # stacks on a signal, for the watchdog's hang diagnosis (fail-open)
        import atexit

        atexit.register(self._at_exit)

    # ---------------------------------------------------------------------------------------------
    # public API: each method checks "enabled?" once, does its work, and never raises

    @property
    def step_count(self) -> int:
        """Optimizer steps done so far."""
        return max(self.opt_steps, self._loss_steps)

    @property
    def resume_from(self) -> str | None:
        """The checkpoint to resume from when the watchdog (or preflight) restarted this script, else None."""
        if self._ff is not None:
            self._ff.note_resume_read(self)
        return os.environ.get(ENV_RESUME_FROM) or None

    def step(self, loss: Any, parts: dict[str, Any] | None = None, weights: dict[str, float] | None = None) -> None:
        """Called once per micro-batch (each forward/backward), before or after `optimizer.step()`.

        `loss` is the total loss (tensor or float); `parts` are its named components, `weights` the
        (scheduled) weight each part carries in the total. Nothing is read back from the device here.
        """
        if os.getpid() != self._pid:
            return
        if threading.get_ident() != self._step_thread and not self._other_thread():
            return
        # Counting goes on even when the guard switched itself off: the loop's `due()` depends on it.
        self.micro += 1
        closes = self.micro % self.grad_accum == 0
        if closes:
            self._loss_steps += 1
        if self._disabled:
            return
        try:
            now = time.time()
            self._t_progress = now
            self._uses_step = True
            self._add_value("loss", loss)
            if self._contracts is not None:
                self._contracts.on_loss(loss)
            if parts:
                for key, value in parts.items():
                    self._add_value(f"part:{key}", value)
            if weights:
                # a weight given as a tensor goes through the device copy like a part; float(tensor) would sync
                self._weights = {}
                for key, value in weights.items():
                    if _is_tensor(value):
                        self._add_value(f"weight:{key}", value)
                    else:
                        self._weights[key] = float(value)
            if closes:
                self._close_loss_side(self._loss_steps, now)
        except Exception as exc:  # the guard never becomes the failure
            self._fail("step", exc)
        if closes and self._ff is not None:
            self._ff.after_step(self)  # may end the script (preflight only, on purpose)

    def _other_thread(self) -> bool:
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

    def set_step(self, step: int) -> None:
        """Tells the guard the optimizer step a resumed run starts from (read from its checkpoint).

        Steps, `due()` and findings then continue from there instead of from 0. Call it once, after
        loading the checkpoint and before the first `guard.step` of the resumed run.
        """
        if os.getpid() != self._pid:
            return
        try:
            step = int(step)
            if step < 0:
                raise ValueError(f"set_step: step must be >= 0, got {step}")
            self.opt_steps = self._loss_steps = step
            self.micro = step * self.grad_accum
            self._records.clear()
            self._pending, self._pending_floats = [], {}
            self._t_last_close = None
            self._t_progress = time.time()
            if not self._disabled:
                self._writer.add_event("probe", "set_step", {"step": step}, step=step)
        except Exception as exc:
            self._fail("set_step", exc)

    def log(self, **values: Any) -> None:
        """Extra per-step scalars (tensors or floats), stored with the step being accumulated.

        Called after the step's last `guard.step`, they go with the next step.
        """
        if self._disabled or os.getpid() != self._pid:
            return
        try:
            for key, value in values.items():
                self._add_value(f"x:{key}", value)
        except Exception as exc:
            self._fail("log", exc)

    def batches(self, iterable: Iterable) -> Iterator:
        """Yields from `iterable`, measuring the time spent waiting for each item (data wait)."""
        if self._contracts is not None and not self._disabled:
            self._contracts.loader(iterable)  # fingerprints DataLoader workers' generators (fail-open)
        if self._ff is not None:
            iterable = self._ff.batches(self, iterable)
        iterator = iter(iterable)
        while True:
            t0 = time.perf_counter()
            try:
                item = next(iterator)
            except StopIteration:
                return
            if not self._disabled:
                self._data_wait += time.perf_counter() - t0
                self._t_progress = time.time()
                try:
                    self._ring.keep(self.micro + 1, item)  # consumed by the next guard.step
                except Exception as exc:
                    self._fail("batches", exc)
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
            # The phase is left before the crash hook runs; remember where this exception came from.
            if self._exc_phase is None or self._exc_phase[0] is not exc:
                self._exc_phase = (exc, name, list(self._phases))
            raise
        finally:
            self._phase_event("end", name, seconds=time.time() - t0)

    def due(self, name: str, every: int) -> bool:
        """True once at every `every`-th optimizer step (e.g. `if guard.due("eval", every=2000): ...`)."""
        try:
            step = self.step_count
            if self._ff is not None and self._ff.due(self, name, every):
                self._due_last[name] = step
                return True
            if every <= 0 or step <= 0 or step % every != 0:
                return False
            if self._due_last.get(name) == step:
                return False  # already answered for this step (the loop may ask once per micro-batch)
            self._due_last[name] = step
            return True
        except Exception as exc:
            self._fail("due", exc)
            return False

    def eval(self, **metrics: Any) -> None:
        """Records evaluation results, e.g. `guard.eval(loss=val_loss, accuracy=acc)`."""
        if self._disabled or os.getpid() != self._pid:
            return
        try:
            # Evaluation is rare and off the hot path: reading a tensor here may synchronise, once.
            values = {k: _to_float(v) for k, v in metrics.items()}
            self._t_progress = time.time()
            self._writer.add_event("eval", None, values, step=self.step_count)
        except Exception as exc:
            self._fail("eval", exc)

    def checkpoint_saved(self, path: str | os.PathLike) -> None:
        """Tells trainguard a checkpoint was written; restarts and preflight resume from the newest one."""
        if self._disabled or os.getpid() != self._pid:
            return
        try:
            p = Path(path)
            size = p.stat().st_size if p.exists() and p.is_file() else None
            self._t_progress = time.time()
            self._writer.add_event(
                "checkpoint", str(p), {"path": str(p.resolve()), "bytes": size}, step=self.step_count
            )
        except Exception as exc:
            self._fail("checkpoint_saved", exc)

    def finish(self) -> None:
        """The script reached its end: flush everything and mark the probe finished.

        Also when the guard switched itself off after errors of its own: the run did end, and saying so
        is what keeps a completed run from being reported as failed.
        """
        if self.finished or os.getpid() != self._pid:
            return
        self.finished = True
        if self in _HOOKED:
            _HOOKED.remove(self)  # a later crash of another guard in this process is not this run's
        self._sched.close()
        try:
            if not self._disabled:
                self._emit_all()
            self._writer.add_event("probe", "finish", {"steps": self.step_count, "micro": self.micro,
                                                       "guard_disabled": self._disabled}, step=self.step_count)
            self._stop.set()
            self._thread.join(timeout=5.0)
            if not self._disabled:
                self._drain(final=True)
            self._writer.flush()
            if self._rules is not None and not self._disabled:
                self._run_rules(final=True)
            if not self.under_watchdog and self.rank == 0:
                self._write_own_status(state="completed")
        except Exception as exc:
            self._fail("finish", exc)

    def experts(self, load: Any, layer: Any = None) -> None:
        """Per-expert load of an MoE layer (tokens routed to each expert), for `expert-collapse`.

        Call it each step for each MoE layer, during the forward (before that micro-batch's
        `guard.step`, which closes the step); it is recorded on the first `stats_every` steps and every
        `stats_every` steps after. A device tensor is copied to the host without a sync.
        """
        if self._disabled or os.getpid() != self._pid:
            return
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
            if _is_tensor(load):
                t = load.detach().float().reshape(-1)
                if t.device.type == "cuda":
                    host, event = devicestats.copy_to_host(t)
                else:
                    host = t.clone()
            self._experts_inflight.append((step, layer, host, event))
        except Exception as exc:
            self._fail("experts", exc)

    def add_observer(self, fn: Any) -> None:
        """Registers `fn(row)` to be called from the background thread with each resolved step row."""
        self._observers.append(fn)

    def __enter__(self) -> Guard:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.finish()

    # ---------------------------------------------------------------------------------------------
    # the hot path's helpers

    def _add_value(self, name: str, value: Any) -> None:
        if _is_tensor(value):
            if self._cuda_index is None and value.device.type == "cuda":
                # the device this process trains on, for the memory samples of the background thread (whose
                # own "current device" is always 0)
                self._cuda_index = value.device.index
            self._pending.append((name, devicestats.as_scalar(value)))
        else:
            self._pending_floats.setdefault(name, []).append(float(value))

    def _close_loss_side(self, step: int, now: float) -> None:
        rec = self._records.setdefault(step, {"step": step})
        rec["t"] = now
        rec["micro"] = self.micro
        rec["pending"] = self._pending
        rec["floats"] = self._pending_floats
        rec["weights"] = dict(self._weights)
        rec["data_wait"] = self._data_wait
        rec["step_time"] = (now - self._t_last_close) if self._t_last_close is not None else None
        if step % 8 == 0:  # one pread, no device sync: for throughput-drop to tell whose slowdown it is
            clock = self._sched.per_step(step)
            if clock is not None:
                rec["cpu_s"], rec["run_wait_s"] = clock
        rec["loss_done"] = True
        if self.scaler is not None:
            # read on the loss side too: a step the GradScaler skips never reaches the optimizer hooks
            scale = getattr(self.scaler, "_scale", None)
            if scale is not None:
                rec["pending"].append(("loss_scale", devicestats.as_scalar(scale)))
        self._pending, self._pending_floats = [], {}
        self._data_wait = 0.0
        self._t_last_close = now
        self._maybe_emit(step)

    def _on_opt_pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._disabled or os.getpid() != self._pid:
            return
        try:
            if self._ff is not None:
                self._ff.before_opt_step(self)
            step = self.opt_steps + 1
            rec = self._records.setdefault(step, {"step": step})
            groups = optimizer.param_groups
            lr = groups[0].get("lr") if groups else None
            if _is_tensor(lr):
                rec.setdefault("opt_tensors", []).append(("lr", devicestats.as_scalar(lr)))
            elif lr is not None:
                rec["lr"] = float(lr)
            if len(groups) > 1:
                rec["lrs"] = [float(g["lr"]) if not _is_tensor(g["lr"]) else None for g in groups]
            if self.scheduler is not None:
                rec["sched_epoch"] = planinfo.sched_epoch(self.scheduler)
            if self.scaler is not None:
                scale = getattr(self.scaler, "_scale", None)  # a device tensor; get_scale() would sync
                if scale is not None:
                    rec.setdefault("opt_tensors", []).append(("loss_scale", devicestats.as_scalar(scale)))
            if step <= self.stats_every or step % self.stats_every == 0:
                self._grad_stats(optimizer, rec)
        except Exception as exc:
            self._fail("optimizer pre-hook", exc)

    def _on_opt_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if os.getpid() != self._pid:
            return
        self.opt_steps += 1  # counted even when switched off: `due()` depends on it
        if self._disabled:
            return
        try:
            self._t_progress = time.time()
            rec = self._records.setdefault(self.opt_steps, {"step": self.opt_steps})
            if self._snapshot is not None:
                before, params, stride = self._snapshot
                self._snapshot = None
                after = _sample_params(params, stride)
                import torch

                delta = torch.linalg.vector_norm(after - before)
                ratio = delta / (torch.linalg.vector_norm(before) + 1e-12)
                rec.setdefault("opt_tensors", []).append(("update_ratio", ratio))
            rec["opt_done"] = True
            if not self._uses_step:
                rec.setdefault("t", time.time())
                if self._pending or self._pending_floats:
                    # a loop that never calls guard.step: what guard.log() gathered belongs to this step
                    rec["pending"] = self._pending
                    rec["floats"] = self._pending_floats
                    self._pending, self._pending_floats = [], {}
            self._maybe_emit(self.opt_steps)
        except Exception as exc:
            self._fail("optimizer post-hook", exc)
        if self._ff is not None and not self._uses_step:
            self._ff.after_step(self)  # a loop without guard.step is stopped here (preflight only)

    def _grad_stats(self, optimizer: Any, rec: dict[str, Any]) -> None:
        import torch

        params = [p for g in optimizer.param_groups for p in g["params"] if p.requires_grad]
        grads = [p.grad for p in params if p.grad is not None and not p.grad.is_sparse]
        if grads:
            norms = torch._foreach_norm(grads)
            total = torch.linalg.vector_norm(torch.stack([n.float() for n in norms]))
            rec.setdefault("opt_tensors", []).append(("grad_norm", total))
        rec["no_grad"] = len(params) - len(grads)
        watched = self._update_sample or [p for p in (self._model_params or params) if p.requires_grad]
        if self._update_sample is None:
            # The update ratio is read from a few tensors, not all: the largest ones (where a model's
            # weights are) plus the first and the last. Each sampled tensor costs a launch or two, and
            # a GPT-sized model has hundreds; a few suffice to see weights that do not move.
            by_size = sorted(watched, key=lambda p: p.numel(), reverse=True)[:6]
            chosen = {id(p): p for p in [watched[0], *by_size, watched[-1]]} if watched else {}
            self._update_sample = watched = list(chosen.values())
        if watched:
            stride = max(1, sum(p.numel() for p in watched) // 65536)
            self._snapshot = (_sample_params(watched, stride), watched, stride)

    def _maybe_emit(self, step: int) -> None:
        rec = self._records.get(step)
        if rec is None:
            return
        # Whether the loop calls `guard.step` is unknown until it first does (it may step the optimizer
        # first), so the loss half is always awaited; the optimizer half only when there is an optimizer.
        need_opt = self.optimizer is not None
        if rec.get("loss_done") and (not need_opt or rec.get("opt_done")):
            self._emit(self._records.pop(step))
        # A step whose other half never came (an optimizer step skipped by the GradScaler, a loop that
        # steps the optimizer without `guard.step`) is emitted once two newer steps exist.
        for old in [k for k in self._records if k < step - 1]:
            rec = self._records.pop(old)
            rec["incomplete"] = self._uses_step
            self._emit(rec)

    def _emit(self, rec: dict[str, Any]) -> None:
        self._maybe_sample_on_step(rec)
        named = list(rec.pop("pending", [])) + list(rec.pop("opt_tensors", []))
        packs = devicestats.pack(named) if named else []
        self._inflight.append((rec, packs))

    def _emit_all(self) -> None:
        if self._device_broken:
            return
        has_loss = "loss" in self._pending_floats or any(n == "loss" for n, _ in self._pending)
        if has_loss:
            # micro-batches of a last, partial accumulation window still belong to a step (scalars
            # logged after the last step alone do not make one)
            self._close_loss_side(self._loss_steps + 1, time.time())
        for key in sorted(self._records):
            rec = self._records.pop(key)
            if not (rec.get("loss_done") or rec.get("opt_done")):
                continue
            self._emit(rec)

    def _phase_event(self, kind: str, name: str, **data: Any) -> None:
        if self._disabled or os.getpid() != self._pid:
            return
        try:
            self._t_progress = time.time()
            if kind == "begin":
                self._phases.append(name)
                self.phases_seen[name] = self.phases_seen.get(name, 0) + 1
                data["nth"] = self.phases_seen[name]
            elif self._phases and self._phases[-1] == name:
                self._phases.pop()
            self._writer.add_event("phase", name, {"edge": kind, **data}, step=self.step_count)
        except Exception as exc:
            self._fail("phase", exc)

    # ---------------------------------------------------------------------------------------------
    # the background thread: resolve device copies, commit, keep status current

    def _background(self) -> None:
        while not self._stop.wait(FLUSH_INTERVAL):
            try:
                self._drain()
                self._sample()
                self._writer.flush()
                self._log_store_trouble()
                if self._rules is not None and time.time() - self._last_rules > RULES_INTERVAL:
                    self._run_rules()
                if not self.under_watchdog and self.rank == 0 and time.time() - self._last_status > STATUS_INTERVAL:
                    try:
                        self._write_own_status(state="running")
                    except Exception as exc:
                        # Why not _fail: status.json is a summary beside the store; a folder that refuses it
                        # (replaced by a directory, full) must not switch the recording off.
                        self._selflog.error("status.json", exc)
            except Exception as exc:
                # Why not let it die: a dead flusher would silently stop recording the run.
                self._fail("background flush", exc)

    def _log_store_trouble(self) -> None:
        w = self._writer
        if w.last_error and w.failed_flushes in (1, 10, 100, 1000):
            self._selflog.write(f"store not written ({w.failed_flushes} tries, rows kept for the next): {w.last_error}")
        if w.refused:
            self._selflog.once("store refused rows", f"store refused a row, dropped ({w.refused} so far; later "
                               f"ones only counted): {w.first_refusal}")

    def _drain(self, final: bool = False) -> None:
        with self._drain_lock:  # the crash hook may drain from the main thread while the flusher runs
            self._drain_locked(final)

    def _drain_locked(self, final: bool) -> None:
        # Device copies finish in launch order, so stop at the first one not yet done. Only this thread
        # removes from `_inflight` and only from its head; the training thread only appends to its tail.
        if self._device_broken:
            return
        done = 0
        for rec, packs in paced(list(self._inflight), enabled=not final, stop=getattr(self, "_stop", None)):
            try:
                if not final and not all(p.ready() for p in packs):
                    break
                if final and not all(p.wait() for p in packs):
                    raise RuntimeError("a device copy cannot be waited for")
            except Exception as exc:
                self._abandon_device(exc)
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
                self._writer.add_event("sample", "memory", rec["memory"], step=row["step"])
            done += 1
            for fn in self._observers:
                try:
                    fn(row)
                except Exception as exc:
                    self._fail("observer", exc)
        del self._inflight[:done]
        self._drain_experts(final)
        if self._contracts is not None:
            self._contracts.drain(final)
        moved = collectives.changed()
        if moved is not None:
            self._writer.set_meta(f"collectives.{self.rank}", moved)
        phase = self._phases[-1] if self._phases else None
        self._writer.set_heartbeat(
            t_progress=self._t_progress, micro=self.micro, step=self.step_count, phase=phase,
            state="finished" if self.finished else "running",
        )

    def _abandon_device(self, exc: BaseException) -> None:
        """The device is in a sticky error state (a device-side assert, an illegal access): every copy still
        in flight is unreadable. Drop them without waiting, and never free them: freeing pinned blocks and
        events after such an error can throw inside a C++ destructor and abort the process, which would
        turn the user's clean crash (exit 1, a traceback) into a SIGABRT."""
        self._device_broken = True
        self._fail("device copies abandoned", exc)
        abandoned = [self._inflight[:], self._experts_inflight[:], self._snapshot]
        self._inflight.clear()
        self._experts_inflight.clear()
        self._snapshot = None
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
                self._abandon_device(exc)
                return
            load = host.tolist() if _is_tensor(host) else [float(v) for v in host]
            self._writer.add_event("experts", None if layer is None else str(layer),
                                   {"layer": None if layer is None else str(layer), "load": load}, step=step)
            done += 1
        self._experts_inflight[:done] = []

    def _maybe_sample_on_step(self, rec: dict[str, Any]) -> None:
        """Memory at a completed step (training thread): every few steps, rate-limited in time.

        The sample rides with the step's record and is stored after its row, with its step; reading the
        counters costs microseconds and never waits for the device (see probe/samples.py)."""
        step = rec.get("step") or 0
        now = time.time()
        # The gap is a share of the planned length; without one it grows with the run (step/1000), so an
        # open-ended run stores samples in proportion to the logarithm of its steps (~2,300 per tenfold).
        every = min(MAX_SAMPLE_EVERY, max(1, (self.total_steps or step) // SAMPLES_PER_RUN))
        if (not self._sampling or step - self._last_sample_step < every
                or now - self._last_sample < samples.MIN_STEP_SAMPLE_GAP):
            return
        self._last_sample_step, self._last_sample = step, now
        rec["memory"] = self._memory_sample()

    def _memory_sample(self) -> dict[str, Any] | None:
        """A memory sample with the phase it was taken in, or None; a failure turns sampling off (once
        logged), never the guard: losing memory samples must not cost the run its step rows."""
        try:
            sample = samples.memory_sample(self._process, self._cuda_index)
        except Exception as exc:
            self._sampling = False
            self._selflog.error("memory samples (switched off)", exc)
            return None
        if sample:
            sample["phase"] = self._phases[-1] if self._phases else None
        return sample

    def _sample(self) -> None:
        """Host and device memory from the background thread when no step brought a sample for a second
        (a long evaluation, a slow step): see probe/samples.py, no device sync."""
        now = time.time()
        if not self._sampling or now - self._last_sample < samples.SAMPLE_INTERVAL:
            return
        self._last_sample = now
        sample = self._memory_sample()
        if sample:
            self._writer.add_event("sample", "memory", sample, step=self.step_count)

    def _run_rules(self, final: bool = False) -> None:
        """The health rules over what was queued since the last time; new findings become events."""
        with self._rules_lock:
            if self._rules is not None:
                self._run_rules_locked(final)

    def _run_rules_locked(self, final: bool) -> None:
        self._last_rules = time.time()
        cpu0 = time.thread_time()
        try:
            stop = getattr(self, "_stop", None)
            found = self._rules.poll(through=(lambda batch: paced(batch, stop=stop)) if not final else None)
            if final:
                found += self._rules.end()
                # what the rules cost this process, for the overhead budget (CPU seconds, all passes)
                # (and how many queued items the rules never saw: their inbox is bounded)
                self._writer.set_meta(f"rules_cpu.{self.rank}", {
                    "cpu_s": round(self.rules_cpu + time.thread_time() - cpu0, 4), "steps": self.step_count,
                    "inbox_dropped": self._rules.dropped})
        except Exception as exc:
            # Why switch them off: a rules pass that raised once will raise at every pass. The store's
            # tap goes too, or rows would pile up in an inbox nobody reads.
            self._rules = None
            self._writer.tap = None
            self._fail("health rules (switched off)", exc)
            return
        self.rules_cpu += time.thread_time() - cpu0
        for f in found:
            self._writer.add_event("finding", f.name, f.to_dict(), step=f.step)
            if self._status_findings is not None:
                self._status_findings[(f.code, f.name, f.step, f.cause)] = f
            try:
                print(f"trainguard: {printable(f.one_line())}", file=sys.stderr, flush=True)
            except (OSError, ValueError):
                pass
        if found:
            self._writer.flush()

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
        if rec.get("lrs"):
            extra["lrs"] = rec["lrs"]
        if rec.get("no_grad"):
            extra["params_without_grad"] = rec["no_grad"]
        if rec.get("cpu_s") is not None:
            extra["cpu_s"], extra["run_wait_s"] = rec["cpu_s"], rec["run_wait_s"]
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
            "loss_scale": values.get("loss_scale"),
            "sched_epoch": rec.get("sched_epoch"),
            "parts": parts,
            "weights": {**(rec.get("weights") or {}), **device_weights},
            "extra": extra,
        }
        self._summary = {"step": row["step"], "loss": row["loss"], "lr": row["lr"]}
        return row

    # ---------------------------------------------------------------------------------------------
    # setup, failure and exit

    def _write_meta(self, label: str, config: dict | None) -> None:
        import getpass
        import platform

        from trainguard import __version__

        w = self._writer
        if self.rank == 0 and self.attempt == 0 and not self.under_watchdog:
            w.set_meta("command", sys.argv)
            w.set_meta("cwd", os.getcwd())
            w.set_meta("started", self._t0)
            w.set_meta("host", platform.node())
            w.set_meta("user", _safe(getpass.getuser))
        w.set_meta("label", label)
        w.set_rank_info(self.place)
        w.set_meta(f"probe.{self.rank}", {
            "pid": self._pid, "python": sys.version.split()[0], "trainguard": __version__,
            "torch": _torch_version(), "attempt": self.attempt, "auto": self.auto,
        })
        self._plan = {
            "total_steps": self.total_steps, "grad_accum": self.grad_accum,
            "scheduler": type(self.scheduler).__name__ if self.scheduler is not None else None,
            "optimizer": type(self.optimizer).__name__ if self.optimizer is not None else None,
            "model": type(self.model).__name__ if self.model is not None else None,
            "scaler": type(self.scaler).__name__ if self.scaler is not None else None,
            "stats_every": self.stats_every,
            "world_size": self.place["world_size"],  # the ranks the cross-rank rules wait for at each step
            "sched_horizon": _safe(lambda: planinfo.sched_horizon(self.scheduler)),
            "sched_warmup": _safe(lambda: planinfo.sched_warmup(self.scheduler)),
            "schedulers": _safe(lambda: planinfo.sched_names(self.scheduler)),
            # TG102 measures scheduler steps per optimizer step from this count (timm's schedulers keep none)
            "sched_counted": _safe(lambda: planinfo.sched_epoch(self.scheduler) is not None),
            "output_size": _safe(lambda: planinfo.output_size(self.model, config)),
        }
        if self.rank == 0:
            w.set_meta("plan", self._plan)
            if config is not None:
                w.set_meta("config", config)
        w.add_event("probe", "start", {"pid": self._pid, "attempt": self.attempt, "auto": self.auto,
                                       "node": self.place["node"], "host": self.place["host"]})
        w.flush()

    def _install_hooks(self) -> None:
        self._model_params = None
        if self.model is not None and hasattr(self.model, "parameters"):
            self._model_params = list(self.model.parameters())
            cuda = [p.device.index for p in self._model_params[:1] if p.device.type == "cuda"]
            if cuda:
                self._cuda_index = cuda[0]
        if self.model is not None and hasattr(self.model, "register_forward_hook"):
            try:
                self._forward_handle = self.model.register_forward_hook(_forward_marker(self))
            except Exception as exc:
                self._fail("forward hook", exc)
        if self.optimizer is None:
            return
        try:
            self._hook_handles = [
                self.optimizer.register_step_pre_hook(self._on_opt_pre),
                self.optimizer.register_step_post_hook(self._on_opt_post),
            ]
        except AttributeError:
            self._selflog.write("optimizer has no step hooks (torch < 2.0?): optimizer steps counted from guard.step")
            self.optimizer = None
        if self._model_params is not None and self.optimizer is not None:
            in_opt = {id(p) for g in self.optimizer.param_groups for p in g["params"]}
            missing = [n for n, p in self.model.named_parameters() if p.requires_grad and id(p) not in in_opt]
            if missing:
                self._writer.add_event("params-not-in-optimizer", None, {
                    "count": len(missing), "names": missing[:20],
                    "total_trainable": sum(1 for p in self._model_params if p.requires_grad),
                })

    def _fail(self, where: str, exc: BaseException) -> None:
        self._errors += 1
        self._selflog.error(where, exc)
        if self._errors >= MAX_GUARD_ERRORS and not self._disabled:
            self._disabled = True
            self._selflog.write(f"too many errors ({self._errors}): the guard switched itself off")

    def _after_fork_in_child(self) -> None:
        # A forked DataLoader worker inherits this object but not its thread, and must never touch the
        # parent's SQLite connection: the guard goes quiet in the child.
        self._disabled = True

    def _at_exit(self) -> None:
        if os.getpid() != self._pid:
            return
        try:
            if not self._disabled:
                self._emit_all()
            self._stop.set()
            self._thread.join(timeout=2.0)
            if not self._disabled:
                self._drain(final=True)
            self._writer.add_event("probe", "exit", {"finished": self.finished, "crashed": self.crashed})
            self._writer.flush()
            if self._rules is not None and not self.finished and not self._disabled:
                self._run_rules(final=True)
            if not self.under_watchdog and self.rank == 0 and not self.finished and not self.crashed:
                self._write_own_status(state="failed", reason=PROBE_NOT_FINISHED.name)
            self._writer.close()
            if self._writer.unstored:  # steps the store never took are counted and said, never lost in silence
                self._selflog.write(f"{self._writer.unstored}; the training itself went on to step {self.step_count}")
        except Exception as exc:
            self._fail("exit", exc)

    def record_crash(self, exc_type: type, exc: BaseException, tb: Any) -> None:
        """Called by the crash hook: records the exception with the step and phase it happened in."""
        if os.getpid() != self._pid:
            return
        try:
            self.crashed = True
            frames = [
                {"file": f.filename, "line": f.lineno, "function": f.name, "code": f.line}
                for f in traceback.extract_tb(tb)
            ]
            phases = list(self._phases)
            if self._exc_phase is not None and self._exc_phase[0] is exc:
                phases = self._exc_phase[2]
            data = {
                "exception": exc_type.__name__,
                "message": str(exc)[:2000],
                "frames": frames[-30:],
                "phase": phases[-1] if phases else None,
                "phases": phases,
                "phases_seen": dict(self.phases_seen),
                "elapsed": time.time() - self._t0,
                "micro": self.micro,
            }
            # The crash itself is written first: the last steps are worth less than the crash, and reading
            # them back from a device in an error state can fail.
            self._writer.add_event("crash", exc_type.__name__, data, step=self.step_count)
            self._writer.flush()
            if _device_error(exc):
                self._abandon_device(exc)
            try:
                self._emit_all()
                self._drain(final=True)
                self._writer.flush()
            except Exception as exc3:
                self._fail("crash record (last steps)", exc3)
            if not self.under_watchdog and self.rank == 0:
                from trainguard.rules.crash import crash_finding

                finding = crash_finding(
                    exception=data["exception"], message=data["message"], frames=frames,
                    step=self.step_count, phase=data["phase"], elapsed=data["elapsed"],
                    phases_seen=data["phases_seen"],
                )
                self._write_own_status(state="crashed", exit_code=1, findings=[finding.to_dict()])
        except Exception as exc2:
            self._fail("crash record", exc2)

    def _write_own_status(self, *, state: str, reason: str | None = None, exit_code: int | None = None,
                          findings: list | None = None) -> None:
        """status.json for a script running alone; under `trainguard run` the watchdog owns it."""
        from trainguard.store.reader import RunReader

        self._last_status = time.time()
        if findings is None:
            if self._status_findings is None:
                with RunReader(self.run_dir) as reader:
                    self._status_findings = {(f.code, f.name, f.step, f.cause): f for f in reader.findings()}
            findings = [f.to_dict() for f in list(self._status_findings.values())]  # a snapshot: list() is atomic
        if reason == PROBE_NOT_FINISHED.name:
            from trainguard.rules.ending import probe_not_finished

            findings.append(probe_not_finished(self.step_count).to_dict())
        status = {
            "state": state,
            "step": self._summary.get("step", self.step_count),
            "total_steps": self.total_steps,
            "phase": self._phases[-1] if self._phases else None,
            "exit_code": exit_code,
            "signal": None,
            "loss": self._summary.get("loss"),
            "lr": self._summary.get("lr"),
            "pid": self._pid,
            "updated": time.time(),
            "watched_by": "probe",
            "owner": self._owner,
            "findings": findings,
        }
        write_status(self.run_dir, status, final=state != "running")


def _forward_marker(guard: Guard) -> Any:
    """A forward hook on the watched model's top module: every forward is progress for the watchdog (an
    evaluation over the same model included), at the cost of one clock read. It holds the guard weakly,
    and is kept out of `torch.compile` graphs (a clock read traced into a graph would be a constant)."""
    return _ForwardMarker(guard)


class _ForwardMarker:
    """The forward hook as an object, not a closure, so that a model saved with its hooks pickles (as an
    inert `Detached`) and a deep-copied model shares it."""

    def __init__(self, guard: Guard) -> None:
        import weakref

        self._ref = weakref.ref(guard)
        self._compiling: Any = None
        try:
            import torch

            self._mark = torch.compiler.disable(self._mark_now)
            # Why ask first: a call through the disabled wrapper costs ~8 us even when nothing compiles
            # (it switches dynamo's frame handling off and on); asking costs ~1 us.
            self._compiling = torch.compiler.is_compiling
        except Exception:
            self._mark = self._mark_now

    def _mark_now(self) -> None:
        g = self._ref()
        if g is not None:
            g._t_progress = time.time()

    def __call__(self, module: Any, args: Any, output: Any) -> None:
        if self._compiling is not None and not self._compiling():
            self._mark_now()  # eager: the plain call is the same as the disabled one
        else:
            self._mark()

    def __deepcopy__(self, memo: dict) -> _ForwardMarker:
        return self

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        from trainguard.probe.detached import Detached

        return (Detached, ())


def _nonfinite_row(row: dict[str, Any]) -> bool:
    values = [row.get("loss"), *(row.get("parts") or {}).values()]
    return any(isinstance(v, float) and not math.isfinite(v) for v in values)


def _device_error(exc: BaseException) -> bool:
    text = f"{type(exc).__name__}: {exc}"
    return "AcceleratorError" in text or "CUDA error" in text or "device-side assert" in text


def _keep_forever(obj: Any) -> None:
    """Make `obj` never be freed, not even at interpreter shutdown (see `Guard._abandon_device`)."""
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


def _to_float(value: Any) -> Any:
    if _is_tensor(value):
        return float(value.detach().float().mean().item()) if value.numel() != 1 else float(value.item())
    if isinstance(value, (int, float)):
        return float(value)
    return value


def _sample_params(params: list[Any], stride: int) -> Any:
    import torch

    return torch.cat([p.detach().reshape(-1)[::stride].float() for p in params])


def _torch_version() -> str | None:
    mod = sys.modules.get("torch")
    return getattr(mod, "__version__", None) if mod else None


def _safe(fn: Any) -> Any:
    try:
        return fn()
    except Exception:
        return None


_HOOKED: list[Guard] = []


def active_guard() -> Guard | None:
    """The guard watching this process now (made by `watch`, not finished), if any."""
    for g in _HOOKED:
        if not g.finished and g._pid == os.getpid() and not g._disabled:
            return g
    return None


def _install_crash_hook(guard: Guard) -> None:
    """Chains sys.excepthook so an uncaught exception is recorded with its step and phase."""
    _HOOKED.append(guard)
    if len(_HOOKED) > 1:
        return
    previous = sys.excepthook

    def hook(exc_type: type, exc: BaseException, tb: Any) -> None:
        if not issubclass(exc_type, KeyboardInterrupt):
            for g in list(_HOOKED):
                if not g.finished:
                    g.record_crash(exc_type, exc, tb)
        previous(exc_type, exc, tb)

    sys.excepthook = hook
