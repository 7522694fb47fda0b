"""TG524-TG525: host and device memory that grows without coming back, or fills the device."""

from __future__ import annotations

import bisect
import collections
from typing import Any

from trainguard.findings import DEVICE_MEMORY, MEMORY, Finding
from trainguard.rules.rule import Rule, finite

GIB = 2**30
MIB = 2**20


class MemoryCreep(Rule):
    """TG524 memory-creep: host or device memory that keeps growing while the run trains.

    ## What it detects
    Memory samples the probe takes as steps complete (every 1-20 steps, at most 20 a second) and once a
    second when no step does: host RSS and, on CUDA, allocated device memory. Not judged: the warm-up,
    the first 100 steps or 1% of the planned run, whichever is more (where a healthy GPU process grows
    by hundreds of MiB: the CUDA context, kernel modules loaded lazily on their first launch, cuBLAS
    workspaces, pinned pools, compile caches, the allocator and Python's arenas filling in); evaluation or checkpoint
    phases (predictions gathered, state copied, then freed); and what came before the end of the first
    evaluation, whose new shapes load more kernels: the series starts again after it.
    The rule fires when a recent stretch of at least 6 samples spanning 2.5% of the plan (50 to 100
    steps) keeps growing:
    - it rose in 60% of its intervals (a rise: more than 256 KiB), and in 3 of its 4 quarters by at
      least an eighth of its growth, and its later half grew at least half as fast as its earlier
      half (a step up that then levels off is not a leak, wherever in the stretch it falls);
    - it grew, even without its two largest increments (a one-off allocation), by at least 5% of the
      memory at its start and 32 MiB;
    - at its rate now (its later half's growth a step, without its largest increment), the growth by the
      end of the planned run (when the plan is known) would reach half of the memory at the stretch's
      start: it may run out before the end; without a plan it has already grown by 10% and 64 MiB.
    The newest 32 samples are kept as they are and the older history thinned (every other one dropped
    when 128 are held), so the rule costs the same at step 100 and at step 1,000,000 and sees a late leak
    as quickly as an early one.

    Per phase: training's memory is compared before and after each evaluation (its phase, or where no
    phase is marked, the results `guard.eval` reports). Three evaluations in a row after the first
    that each leave at least 4 MiB behind, which training never gives back (the next evaluation starts
    at least half of it higher), and together 32 MiB and 5% of the memory: a leak that grows only at
    evaluations (outputs kept in a list across them), which the stretches above never see.

    A run too short for the warm-up window (it ends before step 100 + the stretch) is judged at its end
    on its whole training series, from a tenth of the way in: grown by half and 64 MiB, rising in 60%
    of its intervals and in 3 of its 4 quarters (a warm-up that levels off is not a leak).

    ## Why it matters
    A leak ends in an out-of-memory kill hours in, usually after the last checkpoint. The classic:
    keeping `loss` (a tensor with its graph) in a list instead of `loss.item()`, caches keyed by
    batch, growing lists of metrics.

    ## Example
    `TG524 memory-creep [warning] at step 100: host RSS grew from 594 MiB to 696 MiB over 25 samples
    (steps 100-151), rising in 100% of them: 1.77 MiB a step, +3,269 MiB more by step 2,000`

    `TG524 memory-creep [warning] at step 40: host RSS rose across each of the last 3 evaluations
    (steps 40, 60, 80) by 72, 72, 72 MiB and training never gave it back: 386 MiB before the first of
    them, 602 MiB after the last; at one evaluation every 20 steps, +8,352 MiB more by step 2,400`

    ## What to change
    Store `.item()` or `.detach()` of what you keep; clear caches; look for lists that grow per step.

    ## Known false positives
    A run that grows a replay buffer or cache by design, steadily for longer than the stretch it is
    judged on (50-100 steps) after the warm-up. A leak present from the first step is found only after
    the warm-up (the zoo times it from there: `judged_from` in the evidence).

    ## Options
    None.
    """

    code, name, severity = "TG524", "memory-creep", "warning"
    needs = (MEMORY,)
    SERIES = (("rss", "host RSS"), ("dev_allocated", "device memory allocated"))
    MIN_POINTS = 6
    RISE = 256 * 1024  # bytes: smaller changes are page-level noise, not a rise
    NOT_TRAINING = ("eval", "val", "test", "predict", "save", "checkpoint")
    EVAL = ("eval", "val", "test", "predict")

    def __init__(self, plan: dict[str, Any]) -> None:
        super().__init__(plan)
        self.series: dict[str, _Thinned] = {}
        # a GPU process loads kernels, workspaces and pools over its first ~100 steps (hundreds of MiB)
        self.warmup = max(100, int(0.01 * self.total_steps)) if self.total_steps else 100
        # long enough to see growth continue past a step up, short enough for 200 steps of latency
        self.min_span = max(50, min(100, int(0.025 * self.total_steps))) if self.total_steps else 50
        self.in_first_eval = False
        self.first_eval_done = False
        self.found: set[str] = set()  # series already reported: one finding each, no more judging
        # per phase: training memory before and after each evaluation (a leak that grows only there)
        self.last_train: dict[str, tuple[int, float]] = {}
        self.in_eval: int | None = None  # the step the evaluation under way began at
        self.eval_phases = False  # the run marks its evaluations as phases
        self.before: dict[str, tuple[int, float]] = {}
        self.evals = 0
        self.cycles: dict[str, collections.deque[tuple[int, float, float]]] = {}  # eval step, before, after
        # every training sample from the first step: a run too short for the warm-up window is judged at its end
        self.whole: dict[str, _Thinned] = {}
        self.last_step = 0

    def _eval_begins(self, step: int) -> None:
        if not self.first_eval_done:
            self.in_first_eval = True
        if self.in_eval is None:
            self.in_eval, self.before = step, dict(self.last_train)

    def on_event(self, event: dict[str, Any]) -> Finding | None:
        kind = event.get("kind")
        step = event.get("step") or 0
        # An evaluation's edges: its phase (`guard.phase("eval")`), or, where no phase is ever marked, the
        # results it reports (`guard.eval(...)`, after it ran): a short evaluation takes no sample of its own.
        if kind == "phase" and str(event.get("name") or "").lower().startswith(self.EVAL):
            self.eval_phases = True
            if (event.get("data") or {}).get("edge") == "begin":
                self._eval_begins(step)
            return None
        if kind == "eval" and not self.eval_phases:
            self._eval_begins(step)
            return None
        if kind != "sample":
            return None
        data = event.get("data") or {}
        self.last_step = max(self.last_step, step)
        phase = str(data.get("phase") or "").lower()
        if phase.startswith(self.NOT_TRAINING):
            if phase.startswith(self.EVAL):
                self._eval_begins(step)
            return None
        found, closed = None, False
        if self.in_eval is not None:
            if step > self.in_eval:
                found, closed = self._after_eval(data), True  # the first training sample after the evaluation
            else:  # the sample of the step the evaluation followed, stored after the evaluation began
                self.before.update({k: (step, float(v)) for k, _ in self.SERIES if finite(v := data.get(k))})
        if self.in_first_eval and closed:  # the first evaluation is over: what it loaded is the new baseline
            self.in_first_eval, self.first_eval_done = False, True
            self.series.clear()
            self.whole.clear()
        for key, _ in self.SERIES:
            if finite(value := data.get(key)):
                self.last_train[key] = (step, float(value))
                if step >= 1:
                    self.whole.setdefault(key, _Thinned()).add(step, float(value))
        if found is not None or step < self.warmup:
            return found
        for key, label in self.SERIES:
            value = data.get(key)
            if not finite(value) or key in self.found:
                continue
            series = self.series.setdefault(key, _Thinned())
            series.add(step, float(value))
            leak = _leak(series.view(), self.MIN_POINTS, self.min_span, self.RISE, self.total_steps)
            if leak is None:
                continue
            pts, rises, per_step, projected = leak
            (step0, first), (step1, last) = pts[0], pts[-1]
            self.found.add(key)
            ahead = (f", +{projected / MIB:,.0f} MiB more by step {self.total_steps:,}" if projected is not None
                     else "")
            return self.finding(
                step=step0,
                summary=f"{label} grew from {first / MIB:.0f} MiB to {last / MIB:.0f} MiB over {len(pts)} samples "
                        f"(steps {step0}-{step1}), rising in {rises / (len(pts) - 1):.0%} of them: "
                        f"{per_step / MIB:.2f} MiB a step{ahead}",
                fix="keep .item() or .detach() of what you store per step; clear caches; find the list that grows",
                evidence={"series": key, "first_bytes": first, "last_bytes": last, "samples": len(pts),
                          "bytes_per_step": per_step, "projected_growth_bytes": projected,
                          "judged_from": self.warmup, "detected_step": event.get("step")},
                cause=key,
            )
        return None


    EVAL_RISE = 4 * MIB  # an evaluation that leaves less than this behind is noise
    EVAL_CYCLES = 3  # evaluations in a row (the first of the run aside) that each leave memory behind

    def _after_eval(self, data: dict[str, Any]) -> Finding | None:
        """The first training sample after an evaluation: what the evaluation left behind in training's memory.

        The first evaluation of a run loads kernels and buffers for new shapes once: it is recorded, never
        judged. After it, each evaluation that leaves memory behind (after minus before) which training
        never gives back (the next evaluation starts at least that much higher) is a step of a leak that
        grows only there; three in a row are a leak."""
        at, self.in_eval = self.in_eval, None
        self.evals += 1
        for key, label in self.SERIES:
            value, before = data.get(key), self.before.get(key)
            if not finite(value) or before is None or key in self.found:
                continue
            cycles = self.cycles.setdefault(key, collections.deque(maxlen=self.EVAL_CYCLES))
            if self.evals == 1:
                continue  # the first evaluation: its one-off loads are the new baseline
            cycles.append((at or 0, before[1], float(value)))
            if len(cycles) < self.EVAL_CYCLES:
                continue
            c = list(cycles)
            left = [after - before for _, before, after in c]
            kept = all(c[i + 1][1] >= c[i][2] - 0.5 * left[i] for i in range(len(c) - 1))  # training kept it
            if min(left) < self.EVAL_RISE or not kept or sum(left) < max(32 * MIB, 0.05 * c[0][1]):
                continue
            self.found.add(key)
            per_eval = sum(left) / len(left)
            every = (c[-1][0] - c[0][0]) / (len(c) - 1)
            ahead = ""
            projected = None
            if self.total_steps and every > 0:
                projected = per_eval * max(self.total_steps - c[-1][0], 0) / every
                ahead = f"; at one evaluation every {every:,.0f} steps, +{projected / MIB:,.0f} MiB more by step " \
                        f"{self.total_steps:,}"
            return self.finding(
                step=c[0][0], cause=f"{key}-eval",
                summary=f"{label} rose across each of the last {len(c)} evaluations (steps "
                        f"{', '.join(str(s) for s, _, _ in c)}) by {', '.join(f'{x / MIB:.0f}' for x in left)} MiB and "
                        f"training never gave it back: {c[0][1] / MIB:.0f} MiB before the first of them, "
                        f"{c[-1][2] / MIB:.0f} MiB after the last{ahead}",
                fix="free what the evaluation keeps: clear the list of outputs or predictions it appends to after "
                    "each evaluation, keep .item() or .detach().cpu() of what you store, run it under torch.no_grad()",
                evidence={"series": key, "evals": [[s, b, a] for s, b, a in c], "bytes_per_eval": per_eval,
                          "projected_growth_bytes": projected, "judged_from": c[0][0],
                          "detected_step": self.last_step},
            )
        return None

    def end(self) -> Finding | None:
        """A run too short for the warm-up window (the first 100 steps) to be judged as it went: judged on its
        whole training series once it is over, by its growth a step."""
        if self.last_step >= self.warmup + self.min_span:
            return None  # judged as it went
        for key, label in self.SERIES:
            if key in self.found or key not in self.whole:
                continue
            pts = [(s, v) for s, v in self.whole[key].view() if s >= max(3, 0.1 * self.last_step)]
            if len(pts) < self.MIN_POINTS:
                continue
            (step0, first), (step1, last) = pts[0], pts[-1]
            rises = sum(b - a > self.RISE for (_, a), (_, b) in zip(pts, pts[1:]))
            if last - first < max(64 * MIB, 0.5 * first) or rises < 0.6 * (len(pts) - 1):
                continue
            per_step = _keeps_growing(pts, self.RISE)
            if not per_step:
                continue
            self.found.add(key)
            return self.finding(
                step=step0, cause=f"{key}-short-run",
                summary=f"{label} grew {last / first:.1f}x in a run of {self.last_step:,} steps, from {first / MIB:.0f} "
                        f"MiB to {last / MIB:.0f} MiB (steps {step0}-{step1}, rising in "
                        f"{rises / (len(pts) - 1):.0%} of {len(pts)} samples): {per_step / MIB:.2f} MiB a step, "
                        f"{per_step * 1000 / MIB:,.0f} MiB per 1,000 steps",
                fix="keep .item() or .detach() of what you store per step; clear caches; find the list that grows",
                evidence={"series": key, "first_bytes": first, "last_bytes": last, "samples": len(pts),
                          "bytes_per_step": per_step, "run_steps": self.last_step, "detected_step": self.last_step},
            )
        return None


class _Thinned:
    """A series of (step, value) points in bounded memory: the newest `recent` as they are, the older
    ones thinned (once `keep` are held, every other one is dropped and only every 2nd, 4th, ... point
    leaving the recent window is kept), so the whole run stays in view, coarser with age."""

    def __init__(self, keep: int = 128, recent: int = 32) -> None:
        self.keep = keep
        self.recent: collections.deque[tuple[int, float]] = collections.deque(maxlen=recent)
        self.old: list[tuple[int, float]] = []
        self.stride, self.aged = 1, 0

    def add(self, step: int, value: float) -> None:
        if len(self.recent) == self.recent.maxlen:
            self.aged += 1
            leaving = self.recent[0]
            if self.aged % self.stride == 0:
                self.old.append(leaving)
                if len(self.old) >= self.keep:
                    self.old = self.old[1::2]  # keeps the newest of each pair
                    self.stride *= 2
        self.recent.append((step, value))

    def view(self) -> list[tuple[int, float]]:
        return self.old + list(self.recent)


def _leak(points: list[tuple[int, float]], min_points: int, min_span: int, rise: float,
          total_steps: int | None) -> tuple[list, int, float, float | None] | None:
    """The longest recent stretch (ending at the newest point) that keeps growing, as MemoryCreep's
    docstring says: with its count of rises, its growth a step now (`_keeps_growing`) and the growth that
    rate projects to the end of the plan (None without a plan). The cheap tests run in one pass from the
    end; the quarters only for the stretches that pass them, longest first."""
    if len(points) < min_points:
        return None
    last_step, last = points[-1]
    cheap = []  # (n, rises, steady) of the stretches that pass the one-pass tests, shortest first
    rises = 0
    top1 = top2 = 0.0  # the two largest increments so far
    for n in range(2, len(points) + 1):
        (step0, a), b = points[-n], points[-n + 1][1]
        inc = b - a
        rises += inc > rise
        if inc > top1:
            top1, top2 = inc, top1
        elif inc > top2:
            top2 = inc
        steady = last - a - top1 - top2
        if (n >= min_points and last_step - step0 >= min_span and rises >= 0.6 * (n - 1)
                and steady >= max(0.05 * a, 32 * MIB)):
            cheap.append((n, rises, steady))
    for n, rises, steady in reversed(cheap):
        pts = points[-n:]
        first = pts[0][1]
        per_step = _keeps_growing(pts, rise)
        if not per_step:
            continue
        if total_steps:
            projected = per_step * max(total_steps - last_step, 0)
            if projected < 0.5 * first:
                continue
        else:
            projected = None
            if steady < max(0.1 * first, 64 * MIB):
                continue
        return pts, rises, per_step, projected
    return None


def _keeps_growing(pts: list[tuple[int, float]], rise: float) -> float | None:
    """Growth that continues across the stretch: 3 of its 4 quarters (by step) grew by an eighth of the
    whole and more than `rise`, and the later half grew at least half as much as the earlier half. Returns
    the later half's growth a step without its largest increment (the rate now, one-offs aside), or None."""
    steps = [s for s, _ in pts]
    step0, step1 = steps[0], steps[-1]
    mid = step0 + (step1 - step0) / 2

    def at(step: float) -> float:  # the value of the last sample at or before `step`
        return pts[max(bisect.bisect_right(steps, step) - 1, 0)][1]

    marks = [at(step0 + (step1 - step0) * k / 4) for k in range(5)]
    total = marks[4] - marks[0]
    quarters = [marks[k + 1] - marks[k] for k in range(4)]
    growing = sum(q >= max(total / 8, rise) for q in quarters)
    if total <= 0 or growing < 3 or marks[4] - marks[2] < 0.5 * (marks[2] - marks[0]):
        return None
    later = [(b[1] - a[1], b[0] - a[0]) for a, b in zip(pts, pts[1:]) if a[0] >= mid]
    if not later:
        return None
    largest = max(later)
    grown, took = sum(g for g, _ in later) - largest[0], sum(d for _, d in later) - largest[1]
    return max(grown, 0.0) / took if took > 0 else None


class DeviceMemoryNearFull(Rule):
    """TG525 device-memory-near-full: the accelerator's memory is 95% or more in use.

    ## What it detects
    Three memory samples in a row (taken as steps complete, see memory-creep) where the device's used
    memory (total minus free, from the driver, so other processes on the same device count too) is at
    least 95% of its total, and at least half of the device is reserved by this process itself.

    ## Why it matters
    At 96-98% (seed 002) the next longer sequence or larger eval batch is an out-of-memory crash,
    and the caching allocator spends time defragmenting. Better to know while there is headroom to
    decide.

    ## Example
    `TG525 device-memory-near-full [warning] at step 120: device 0 is 97% full (77.1 of 79.6 GiB in
    use; this process has 74.0 GiB allocated, 76.2 GiB reserved)`

    ## What to change
    Smaller micro-batch with more gradient accumulation, activation checkpointing, bf16, shorter
    `max_length`, `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` for fragmentation.

    ## Known false positives
    Frameworks that reserve most of the memory up front on purpose (JAX-style preallocation).

    ## Options
    None.
    """

    code, name, severity = "TG525", "device-memory-near-full", "warning"
    needs = (DEVICE_MEMORY,)
    FULL = 0.95

    def __init__(self, plan: dict[str, Any]) -> None:
        super().__init__(plan)
        self.first_full: dict[str, Any] | None = None  # first sample of the current run of full ones
        self.full = 0

    def on_event(self, event: dict[str, Any]) -> Finding | None:
        if event.get("kind") != "sample":
            return None
        d = event.get("data") or {}
        total, free = d.get("dev_total"), d.get("dev_free")
        if not (finite(total) and finite(free)) or total <= 0:
            return None
        used = (total - free) / total
        own = d.get("dev_reserved", 0) / total if finite(d.get("dev_reserved")) else 1.0
        # Half of the device must be this process's own: another job filling a shared device is its finding.
        if used < self.FULL or own < 0.5:
            self.first_full, self.full = None, 0
            return None
        self.first_full = self.first_full or event
        self.full += 1
        if self.full < 3:
            return None
        return self.finding(
            step=self.first_full.get("step"),
            summary=f"device {d.get('device', 0)} is {used:.0%} full ({(total - free) / GIB:.1f} of {total / GIB:.1f} "
                    f"GiB in use; this process has {d.get('dev_allocated', 0) / GIB:.1f} GiB allocated, "
                    f"{d.get('dev_reserved', 0) / GIB:.1f} GiB reserved)",
            fix="smaller micro-batch with more accumulation, activation checkpointing, bf16, shorter sequences",
            evidence={**d, "used_fraction": used, "detected_step": event.get("step")},
        )
