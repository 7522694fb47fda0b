"""TG52x: the process around the training: output, speed, data, memory, checkpoints.

(TG501-506, crashes, hangs and artifacts, live in the watchdog; these are the health rules' share.)
"""

from __future__ import annotations

import collections
from typing import Any

from trainguard.findings import CHECKPOINTS, DATA_WAIT, OUTPUT, STEP_TIME, Finding
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
    or other processes kept half a core more busy than in the baseline, /proc/stat; or, on a machine
    whose cores were already full, a quarter more runnable tasks a core than in the baseline and at
    least one a core, /proc/loadavg). CPU time that
    tripled is the run's own work: a warning, unless the load shows and the training thread's wait for
    a CPU grew more than its own CPU time (oversubscribed cores make torch's threads spin at their
    barriers: x3-x13 seen) and either the growth stays under x10 or the extra CPU time is spread over the
    process's threads (the training thread's own share of it at most 70%: spinning adds to every thread
    alike, 1/T of it to the training thread's; work the run added on its training thread, a decode in the
    main process, is all its own). CPU time that grew less is the machine's when its load
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
    CLOCK = ("cpu_s", "run_wait_s", "proc_cpu_s", "others_cores", "runnable_per_core")  # probe/schedclock.py, every 8th step

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
        for key in ("run_wait_s", "others_cores", "runnable_per_core"):
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
        if more and (grew >= 3 or (grew >= 2 and not load)) and not (load and self._queued() and (grew < 10 or self._spread())):
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

    def _queued(self) -> bool:
        """The training thread's wait for a CPU grew more than its own CPU time did: on cores oversubscribed
        by other processes torch's threads spin at their barriers, so the process's CPU time a step grows
        x3-x6 (seen on a 2-core machine full before the baseline, with two busy processes more) without any
        work of the run's; the thread then spends more of the extra time queued than running."""
        cpu, wait = self._clock("cpu_s"), self._clock("run_wait_s")
        return cpu is not None and wait is not None and wait[1] - wait[0] > cpu[1] - cpu[0] > 0

    def _spread(self) -> bool:
        """The extra CPU time a step is spread over the process's threads rather than the training thread's own:
        torch's threads spinning at their barriers on oversubscribed cores add to each thread alike (the
        training thread's share of the extra was 49-52% with two threads on a loaded 2-core machine), where work the
        run added on its training thread (a decode fallen back to the main process) is nearly all that thread's."""
        thread, proc = self._clock("cpu_s"), self._clock("proc_cpu_s")
        if thread is None or proc is None:
            return False
        extra = proc[1] - proc[0]
        return extra > 0 and thread[1] - thread[0] <= 0.7 * extra

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
        # busy cores saturate on a machine already full before the baseline; the queue for them does not
        queue = self._clock("runnable_per_core")
        if not said and queue is not None and queue[1] >= 1.0 and queue[1] - queue[0] >= 0.25:
            said.append(f"{queue[1]:.1f} tasks a core were runnable ({queue[0]:.1f} in its baseline): more "
                        "processes queued for the same cores")
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
    `TG526 checkpoint-stale [warning] at step 120: no checkpoint from step 100 to step 150 (50 steps); the
    run saved every 20 steps until then`

    ## What to change
    Check the save condition and its `try`; save on a step count (`guard.due("save", every=N)`).

    A run that saves only on a new best evaluation (nanoGPT's `always_save_checkpoint=False`, a
    best-model callback) is not judged on its saves once they have all come with a new best: its saves
    stop because the evaluation stopped improving, which its evaluation curve shows, not its saver.

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
        self.best: float | None = None  # the lowest evaluation loss so far
        self.on_best = 0  # saves made at the step of a new best evaluation
        self.other = 0  # saves made anywhere else, and new bests that went unsaved
        self.unsaved_best: int | None = None  # the step of the latest new best, until a save comes with it

    def on_event(self, event: dict[str, Any]) -> None:
        kind, at = event.get("kind"), event.get("step")
        if kind == "eval" and isinstance(at, int):
            loss = (event.get("data") or {}).get("loss")
            if finite(loss) and (self.best is None or loss < self.best):
                if self.unsaved_best is not None and self.saves:
                    self.other += 1  # a new best came and went without a save: not a save-on-best policy
                self.best, self.unsaved_best = loss, at
        if kind == "checkpoint" and at is not None:
            if not self.saves or at > self.saves[-1]:
                step = int(at)
                if self.saves:
                    self._count_gap(step - self.saves[-1])
                self.saves.append(step)
                if step == self.unsaved_best:
                    self.on_best += 1
                    self.unsaved_best = None
                else:
                    self.other += 1

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
        if self.on_best >= 2 and not self.other:
            return None  # it saves on a new best evaluation only: no new best since, so no save
        return self.finding(
            step=int(self.saves[-1] + interval),
            summary=f"no checkpoint from step {self.saves[-1]} to step {row['step']} ({since} steps); the run saved "
                    f"every {fmt(interval)} steps until then",
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
