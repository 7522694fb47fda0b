"""TG52x: the process around the training: output, speed, data, memory, checkpoints.

(TG501-506, crashes, hangs and artifacts, live in the watchdog; these are the health rules' share.)
"""

from __future__ import annotations

import bisect
import collections
from typing import Any

from trainguard.findings import CHECKPOINTS, DATA_WAIT, DEVICE_MEMORY, MEMORY, OUTPUT, STEP_TIME, Finding
from trainguard.rules.rule import Rule, finite, fmt, median

GIB = 2**30
MIB = 2**20


class LogFlood(Rule):
    """TG521 log-flood: more lines of output per optimizer step than anyone can read.

    ## What it detects
    Lines the run printed (counted by the watchdog from its captured output; offline, from
    `output.log` or the log itself) per optimizer step, over a window of 2% of the planned run (20 to
    100 steps): above 8 lines a step, with at least 200 lines in the window, scrolling faster than
    anyone reads (above 20 lines a second). Offline, where the lines carry no time, the volume must
    say it instead: 100,000 lines or more over the run.

    ## Why it matters
    A log that scrolls dozens of lines a step hides the one line that matters, slows the loop (printing
    can sync the device when it formats a tensor) and fills disks. Seed 004 printed 36 lines a step;
    its real warnings were lost in them.

    ## Example
    `TG521 log-flood [warning] at step 1: 36.2 lines of output per optimizer step over steps 1-51
    (1,846 lines, 720 a second)`

    ## What to change
    Print every N steps (`guard.due("log", every=N)`), move per-batch detail to a debug level, and
    print each warning once.

    ## Known false positives
    A progress bar that redraws with newlines instead of carriage returns. A loop whose steps take
    minutes and print a report of a dozen lines each (a reinforcement-learning loop printing its
    samples and timings) is not one: 30 lines a step at 277 s a step scroll 0.1 lines a second.

    ## Options
    None.
    """

    code, name, severity = "TG521", "log-flood", "warning"
    needs = (OUTPUT,)
    PER_STEP = 8.0
    PER_SECOND = 20.0  # faster than anyone reads a scrolling terminal
    UNTIMED = 100_000  # lines over the window, where the lines carry no time (a log read offline)

    def __init__(self, plan: dict[str, Any]) -> None:
        super().__init__(plan)
        self.w = self.window(0.02, 20, 100)
        self.samples: collections.deque[tuple[int, int, float | None]] = collections.deque()

    def on_event(self, event: dict[str, Any]) -> Finding | None:
        if event.get("kind") != "output":
            return None
        step, lines = event.get("step"), (event.get("data") or {}).get("lines")
        if step is None or lines is None:
            return None
        t = event.get("t")
        self.samples.append((int(step), int(lines), float(t) if finite(t) else None))
        base = None
        while len(self.samples) >= 2 and self.samples[1][0] <= step - self.w:
            self.samples.popleft()
        if self.samples[0][0] <= step - self.w:
            base = self.samples[0]
        if base is None:
            return None
        steps, count = step - base[0], lines - base[1]
        rate = count / steps
        if rate <= self.PER_STEP or count < 200:
            return None
        # lines a step alone cannot say it: a loop of minutes a step may print a dozen-line report each
        seconds = t - base[2] if finite(t) and base[2] is not None else None
        per_second = count / seconds if seconds else None
        if per_second is not None and per_second <= self.PER_SECOND:
            return None
        if seconds is None and count < self.UNTIMED:
            return None
        pace = f", {per_second:.0f} a second" if per_second is not None else ""
        return self.finding(
            step=max(1, base[0]),
            summary=f"{rate:.1f} lines of output per optimizer step over steps {base[0]}-{step} ({fmt(count)} lines"
                    f"{pace})",
            fix="print every N steps (guard.due('log', every=N)) and each warning once",
            evidence={"lines_per_step": rate, "lines": count, "steps": steps, "lines_per_second": per_second,
                      "detected_step": step},
        )


class ThroughputDrop(Rule):
    """TG522 throughput-drop: steps became much slower than the run's own normal.

    ## What it detects
    The median step time over the last 50 steps against the run's own baseline (the median of its
    steps 6-55): more than 3x slower and at least 20 ms more a step (so a loaded machine slowing a tiny
    model's 2 ms steps is not reported). Then it says whose slowdown it is, from the process's own CPU
    time per step (every thread, sampled by the probe every 8th step) and other processes' load (the
    training thread waited for a CPU others held, Linux schedstat, for at least half the extra time;
    or other processes kept half a core more busy than in the baseline, /proc/stat). CPU time that
    tripled is the run's own work: a warning. CPU time that grew less is the machine's when its load
    shows (contended cores stretch the CPU time of the same work: torch's threads spin longer at their
    barriers; x1.4 to x2.9 seen): info, cause `machine`; the run's when it doubled with no load to
    blame: a warning; otherwise the run waits off the CPU each step (a sleep, a read, a lock, cores
    the machine's host took): info, cause `off-cpu`.

    ## Why it matters
    A run that slows down mid-way finishes late or not at all within its allocation: a leak that
    makes the allocator thrash, a dataloader fallen back to decoding on the training process, a
    growing Python list scanned each step. Another job on the same machine is a different matter: the
    run is fine, the placement is not (12 healthy runs on a shared 2-core machine gave 3 warnings
    whose own evidence said so: wall time per step x33, the run's CPU time per step x1.4).

    ## Example
    `TG522 throughput-drop [warning] at step 180: steps take 41.2 ms (median of the last 50) against
    a baseline of 6.1 ms (steps 6-55), 6.8x slower; data wait is 2% of it; the process's own CPU time
    per step went from 5.9 to 39.8 ms`

    `TG522 throughput-drop [info] at step 150: steps take 252 ms (median of the last 50) against a
    baseline of 74.0 ms (steps 7-56), 3.4x slower, but the process's own CPU time per step went from
    10.9 to 9.5 ms (x0.9 against x3.4 for the wall time): the extra time is not the run's work; other
    processes kept 3.0 cores busy (0.1 in its baseline): the machine is shared, not the run at fault`

    ## What to change
    Look at what changed at that step: data wait (`data-wait-dominant`), memory (`memory-creep`),
    other processes on the machine; take a py-spy dump of the slow loop. For the machine's case:
    give the run dedicated cores (a scheduler reservation, `taskset`), or move the other jobs.

    ## Known false positives
    A run that deliberately switches to longer sequences or larger batches. Without the probe (a log
    read by `diagnose`) there is no CPU time to attribute with, and the finding stays a warning. A
    slowdown spent waiting (a read from a slow network file system each step) is only a note: the
    process's CPU time does not show it, and a shared machine looks the same from inside.

    ## Options
    None.
    """

    code, name, severity = "TG522", "throughput-drop", "warning"
    needs = (STEP_TIME,)
    W = 50
    CLOCK = ("cpu_s", "run_wait_s", "proc_cpu_s", "others_cores")  # probe/schedclock.py, every 8th step

    def __init__(self, plan: dict[str, Any]) -> None:
        super().__init__(plan)
        self.base: list[tuple[float, dict[str, float]]] = []  # step time, the clock's numbers at that step
        self.base_steps: tuple[int, int] | None = None
        self.recent: collections.deque[tuple[int, float, float, dict[str, float]]] = collections.deque(maxlen=self.W)
        self.between: int | None = None  # the step after which an evaluation or save ran, until the clock's next sample
        self.skip = 5
        self.n = 0

    def on_event(self, event: dict[str, Any]) -> None:
        # An evaluation, a save or another phase between two steps: the clock's next sample (the CPU time of
        # the 8 steps around it) holds its work, which is not the steps' own.
        kind, step = event.get("kind"), event.get("step")
        if not isinstance(step, int):
            return
        if kind in ("eval", "checkpoint") or (kind == "phase" and (event.get("data") or {}).get("edge") == "begin"
                                              and not str(event.get("name") or "").lower().startswith("train")):
            self.between = step if self.between is None else min(self.between, step)

    def on_step(self, row: dict[str, Any]) -> Finding | None:
        st = row.get("step_time")
        if not finite(st) or st <= 0:
            return None
        self.n += 1
        if self.n <= self.skip:
            return None  # warm-up steps (allocation, compilation) are not the baseline
        extra = row.get("extra") or {}
        clock = {k: float(v) for k in self.CLOCK if finite(v := extra.get(k))}
        if clock and self.between is not None and row["step"] > self.between:
            clock, self.between = {}, None  # this sample spans the evaluation or save: left out
        if len(self.base) < self.W:
            self.base.append((st, clock))
            if len(self.base) == self.W:
                self.base_steps = (row["step"] - self.W + 1, row["step"])
            return None
        wait = data_wait if finite(data_wait := row.get("data_wait")) else 0.0
        self.recent.append((row["step"], st, wait, clock))
        if len(self.recent) < self.W or self.n % 10:
            return None
        base = median([t for t, _ in self.base])
        now = median([s for _, s, _, _ in self.recent])
        if now <= 3 * base or now - base < 0.020:
            return None
        onset = next((s for s, t, _, _ in self.recent if t > 2 * base), self.recent[0][0])
        share = sum(w for _, _, w, _ in self.recent) / max(1e-12, sum(t for _, t, _, _ in self.recent))
        assert self.base_steps is not None  # set when the baseline filled up
        summary = (f"steps take {now * 1e3:.1f} ms (median of the last {self.W}) against a baseline of "
                   f"{base * 1e3:.1f} ms (steps {self.base_steps[0]}-{self.base_steps[1]}), {now / base:.1f}x slower")
        evidence: dict[str, Any] = {"baseline_s": base, "recent_s": now, "ratio": now / base, "data_wait_share": share,
                                    "detected_step": row["step"]}
        look = "look at what changed at that step: data wait, memory, other processes; py-spy dump the loop"
        cpu = self._clock("proc_cpu_s") or self._clock("cpu_s")  # the process's CPU; old rows: the thread's
        if cpu is None:
            return self.finding(step=onset, summary=f"{summary}; data wait is {share:.0%} of it", fix=look,
                                evidence=evidence)
        cpu_base, cpu_now = cpu
        evidence.update({"cpu_s_baseline": cpu_base, "cpu_s_recent": cpu_now})
        for key in ("run_wait_s", "others_cores"):
            if (pair := self._clock(key)) is not None:
                evidence[f"{key}_baseline"], evidence[f"{key}_recent"] = pair
        cpu_words = f"the process's own CPU time per step went from {cpu_base * 1e3:.1f} to {cpu_now * 1e3:.1f} ms"
        grew = cpu_now / max(cpu_base, 1e-9)
        more = cpu_now - cpu_base >= 0.002
        load = self._machine_load(now - base)
        # Whose time: work that tripled is the run's, whatever the machine does; work that grew less is the
        # machine's when other processes' load shows (on contended cores the same work costs more CPU time:
        # torch's threads spin at their barriers longer, caches are shared; x1.4-x2.9 seen), the run's when
        # it doubled with no load to blame, and otherwise the run waits off the CPU (at most a note).
        if more and (grew >= 3 or (grew >= 2 and not load)):
            return self.finding(step=onset, evidence=evidence, fix=look,
                                summary=f"{summary}; data wait is {share:.0%} of it; {cpu_words}")
        slow = (f"{summary}, but {cpu_words} (x{grew:.1f} against x{now / base:.1f} for the wall time): the extra "
                "time is not the run's work")
        if load:
            return self.finding(step=onset, severity="info", cause="machine", evidence=evidence,
                                summary=f"{slow}; {load}: the machine is shared, not the run at fault",
                                fix="give the run dedicated cores (a scheduler reservation, taskset) or move the other "
                                    "jobs")
        return self.finding(step=onset, severity="info", cause="off-cpu", evidence=evidence,
                            summary=f"{slow}; it waits off the CPU each step (data wait is {share:.0%} of it): a "
                                    "sleep, a file or network read, a lock, or cores the machine's host took",
                            fix="py-spy dump the loop to see what it waits on; if other jobs share the machine, give "
                                "the run dedicated cores")

    def _machine_load(self, extra_s: float) -> str:
        """What shows other processes held the CPUs during the slow steps (empty when nothing does)."""
        said = []
        wait = self._clock("run_wait_s")
        if wait is not None and wait[1] - wait[0] >= 0.5 * extra_s:
            said.append(f"it waited {wait[1] * 1e3:.0f} ms a step for a CPU other processes held ({wait[0] * 1e3:.0f} "
                        "ms in its baseline)")
        others = self._clock("others_cores")
        if others is not None and others[1] - others[0] >= 0.5:
            said.append(f"other processes kept {others[1]:.1f} cores busy ({others[0]:.1f} in its baseline)")
        return " and ".join(said)

    def _clock(self, key: str) -> tuple[float, float] | None:
        """The median of one clock number a step, baseline then recent (sampled every 8th step); None
        without 3 samples of each."""
        b = [c[key] for _, c in self.base if key in c]
        r = [c[key] for _, _, _, c in self.recent if key in c]
        if min(len(b), len(r)) < 3:
            return None
        return median(b), median(r)


class DataWaitDominant(Rule):
    """TG523 data-wait-dominant: the loop spends most of each step waiting for data.

    ## What it detects
    From `guard.batches(loader)`: the time spent waiting for the next batch as a share of step time,
    summed over the last 20 steps: above 50%, with at least 2 ms of waiting per step, and the median
    step of those 20 itself waiting for more than half its time. (A loader that keeps up except at an
    epoch's start, where its workers are spawned again, waits long on one step in 16 and not at all on
    the others: that is not a pipeline the loop is waiting on, and on a loaded machine it alone can
    pass 50% of a short epoch.)

    ## Why it matters
    The accelerator idles while the input pipeline catches up: the run costs twice what it should.

    ## Example
    `TG523 data-wait-dominant [warning] at step 60: 78% of step time over the last 20 steps is spent
    waiting for data (31.0 ms of 39.7 ms a step)`

    ## What to change
    More `num_workers`, `pin_memory=True`, `persistent_workers=True`, prefetching, pre-tokenised
    data, decoding off the training process.

    ## Known false positives
    Tiny models on a CPU, where even a fast loader is comparable to the step.

    ## Options
    None.
    """

    code, name, severity = "TG523", "data-wait-dominant", "warning"
    needs = (DATA_WAIT,)
    W = 20

    def __init__(self, plan: dict[str, Any]) -> None:
        super().__init__(plan)
        self.recent: collections.deque[tuple[int, float, float]] = collections.deque(maxlen=self.W)
        self.n = 0

    def on_step(self, row: dict[str, Any]) -> Finding | None:
        st, wait = row.get("step_time"), row.get("data_wait")
        if not (finite(st) and finite(wait)) or st <= 0:
            return None
        self.n += 1
        self.recent.append((row["step"], st, wait))
        if len(self.recent) < self.W or self.n % 5:
            return None
        total = sum(t for _, t, _ in self.recent)
        waited = sum(w for _, _, w in self.recent)
        share = waited / total
        if share <= 0.5 or waited / self.W < 0.002:
            return None
        typical = median([w / t for _, t, w in self.recent])
        if typical <= 0.5:
            return None
        return self.finding(
            step=self.recent[0][0],
            summary=f"{share:.0%} of step time over the last {self.W} steps is spent waiting for data "
                    f"({waited / self.W * 1e3:.1f} ms of {total / self.W * 1e3:.1f} ms a step)",
            fix="more DataLoader workers, pin_memory, persistent_workers, prefetching, pre-processed data",
            evidence={"share": share, "median_step_share": typical, "wait_per_step_s": waited / self.W,
                      "step_time_s": total / self.W, "detected_step": row["step"]},
        )


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


class CheckpointStale(Rule):
    """TG526 checkpoint-stale: no checkpoint for far longer than the run's own interval.

    ## What it detects
    After two checkpoints (`guard.checkpoint_saved(path)`), the run's own interval is the median gap
    in steps between them. The rule fires when 2.5 intervals (and at least 10 steps more than one)
    have passed since the last checkpoint.

    ## Why it matters
    A crash now loses everything since the last checkpoint, and a restart resumes from further back
    than anyone planned. Saving stops silently more often than it fails loudly: a condition on the
    step that stops matching, a save inside a branch the loop no longer reaches, a full disk caught by
    a bare `except`.

    ## Example
    `TG526 checkpoint-stale [warning] at step 120: no checkpoint since step 100 (50 steps ago); the run
    saved every 20 steps until then`

    ## What to change
    Check the save condition and its `try`; save on a step count (`guard.due("save", every=N)`).

    ## Known false positives
    A run that saves more often at the start by design.

    ## Options
    None.
    """

    code, name, severity = "TG526", "checkpoint-stale", "warning"
    needs = (CHECKPOINTS,)
    MAX_SIZES = 512  # gap sizes counted exactly; beyond, to 3 significant digits

    def __init__(self, plan: dict[str, Any]) -> None:
        super().__init__(plan)
        # The gaps between saves, counted by size: their median is the interval. Checkpoints in a long
        # log number in the thousands but their gaps take few sizes, so a count per size stays small
        # where a list of every save would grow (and a median over it at every step would crawl).
        self.gaps: collections.Counter[int] = collections.Counter()
        self.coarse = False  # past MAX_SIZES sizes, gaps are counted to 3 significant digits
        self.saves: collections.deque[int] = collections.deque(maxlen=10)  # the latest, for the evidence
        self.interval: float | None = None

    def on_event(self, event: dict[str, Any]) -> None:
        if event.get("kind") == "checkpoint" and event.get("step") is not None:
            if not self.saves or event["step"] > self.saves[-1]:
                step = int(event["step"])
                if self.saves:
                    self._count_gap(step - self.saves[-1])
                self.saves.append(step)

    def _count_gap(self, gap: int) -> None:
        if not self.coarse and len(self.gaps) >= self.MAX_SIZES:
            # Time-based saving gives a new gap size at nearly every save: rounding keeps the count
            # bounded and moves the median by under 0.5%.
            self.coarse = True
            rounded: collections.Counter[int] = collections.Counter()
            for size, n in self.gaps.items():
                rounded[_three_digits(size)] += n
            self.gaps = rounded
        self.gaps[_three_digits(gap) if self.coarse else gap] += 1
        self.interval = _counted_median(self.gaps)

    def on_step(self, row: dict[str, Any]) -> Finding | None:
        interval = self.interval
        if interval is None:
            return None
        since = row["step"] - self.saves[-1]
        if since < 2.5 * interval or since < interval + 10:
            return None
        return self.finding(
            step=int(self.saves[-1] + interval),
            summary=f"no checkpoint since step {self.saves[-1]} ({since} steps ago); the run saved every "
                    f"{fmt(interval)} steps until then",
            fix="check the save condition and its try/except; save on a step count (guard.due('save', every=N))",
            evidence={"last_checkpoint_step": self.saves[-1], "interval": interval, "steps_since": since,
                      "checkpoints": list(self.saves), "detected_step": row["step"]},
        )


def _three_digits(n: int) -> int:
    """`n` rounded to 3 significant digits (123456 -> 123000)."""
    unit = 10 ** max(0, len(str(n)) - 3)
    return round(n / unit) * unit


def _counted_median(counts: collections.Counter[int]) -> float:
    """The median of the values a Counter counts, as `engine.median` gives it for the expanded list."""
    n = sum(counts.values())
    want = (n // 2 - 1, n // 2) if n % 2 == 0 else (n // 2, n // 2)
    found: list[float] = []
    seen = 0
    for value in sorted(counts):
        seen += counts[value]
        while len(found) < 2 and seen > want[len(found)]:
            found.append(value)
    return found[0] if n % 2 else 0.5 * (found[0] + found[1])
