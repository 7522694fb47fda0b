"""What the probe writes when it starts: who it is, where it runs, and the plan the rules judge against."""

from __future__ import annotations

import sys
from typing import Any

from trainguard.contract import EVENT_PROBE
from trainguard.probe import planinfo


def record_start(writer: Any, guard: Any, *, pid: int, label: str, config: dict | None) -> dict[str, Any]:
    """Queues the probe's meta, its place among the ranks, the plan and the `probe start` event, then
    commits them; returns the plan (meta "plan": what the run meant to do, for the rules)."""
    from trainguard import __version__

    w = writer
    w.set_meta("label", label)
    w.set_rank_info(guard.place)
    w.set_meta(f"probe.{guard.rank}", {
        "pid": pid, "python": sys.version.split()[0], "trainguard": __version__,
        "torch": _torch_version(), "attempt": guard.attempt, "auto": guard.auto,
    })
    scheduler, model = guard.scheduler, guard.model
    plan = {
        "total_steps": guard.total_steps, "grad_accum": guard.grad_accum,
        "scheduler": type(scheduler).__name__ if scheduler is not None else None,
        "optimizer": type(guard.optimizer).__name__ if guard.optimizer is not None else None,
        "model": type(model).__name__ if model is not None else None,
        "scaler": type(guard.scaler).__name__ if guard.scaler is not None else None,
        "stats_every": guard.stats_every,
        "world_size": guard.place["world_size"],  # the ranks the cross-rank rules wait for at each step
        "sched_horizon": _safe(lambda: planinfo.sched_horizon(scheduler)),
        "sched_warmup": _safe(lambda: planinfo.sched_warmup(scheduler)),
        "schedulers": _safe(lambda: planinfo.sched_names(scheduler)),
        # TG102 measures scheduler steps per optimizer step from this count (timm's schedulers keep none)
        "sched_counted": _safe(lambda: planinfo.sched_epoch(scheduler) is not None),
        "output_size": _safe(lambda: planinfo.output_size(model, config)),
        "learning": guard.learning,
    }
    if guard.rank == 0:
        w.set_meta("plan", plan)
        if config is not None:
            w.set_meta("config", config)
    w.add_event(EVENT_PROBE, "start", {"pid": pid, "attempt": guard.attempt, "auto": guard.auto,
                                       "node": guard.place["node"], "host": guard.place["host"]})
    w.flush()
    return plan


def _torch_version() -> str | None:
    mod = sys.modules.get("torch")
    return getattr(mod, "__version__", None) if mod else None


def _safe(fn: Any) -> Any:
    try:
        return fn()
    except Exception:
        return None
