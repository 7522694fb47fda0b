"""TG70x: rules that compare the ranks of a distributed run with each other.

Every rank's rows are in the store (`rank` on each), and the engine gives these rules all of them
(`all_ranks = True`); the per-rank rules judge each rank alone. What only a comparison shows:

- one rank's loss or gradient norm goes non-finite while the others' stay finite (TG702): the first
  rank to go bad is the cause, the others' NaNs a step later are what the all-reduce spread;
- a straggler (TG703): one rank works longer before each synchronisation, the others wait for it;
- DDP replicas whose gradient norms differ after the all-reduce (TG704; parameter checksums are
  TG701's, rules/contracts.py);
- a rank that stopped advancing while the others go on (TG705).

Rows of one step arrive from the ranks at different moments (each rank flushes in batches); a step is
judged once every rank has written it, or once a missing rank has written a later step.
"""

from __future__ import annotations

import collections
from typing import Any

from trainguard.findings import RANKS, Finding
from trainguard.rules.rule import Rule, finite, fmt, median

# an event the end of a run's reading feeds the rules: {"kind": STEPS_REACHED, "data": {rank: step}}, the
# last step each rank is known to have finished by its heartbeat and flight-recorder answers
# (`RunReader.steps_reached`)
STEPS_REACHED = "steps_reached"


class _ByStep:
    """The rows of the last steps, by step and rank; yields each step once it is complete.

    Each rank's probe flushes its rows in batches, so the store holds one rank's rows for many steps
    before the next rank's for the same steps (a short or fast run: rank 0's whole run first). A step
    waits for every rank; it is judged without a rank only once that rank has written a step past it
    (it skipped this one) or the steps held pass KEEP (a rank that stopped writing is not waited for
    forever; TG705 says it stopped).
    """

    KEEP = 2048  # steps held at most while a rank's rows have not arrived

    def __init__(self, plan: dict[str, Any]) -> None:
        world = plan.get("world_size")
        # the ranks to wait for: the plan says how many (rank 0's probe writes it); a log without it, the
        # ranks seen so far (and at least two, so the first rank's first row is not judged alone)
        self.world = world if isinstance(world, int) and world > 0 else None
        self.rows: collections.OrderedDict[int, dict[int, dict[str, Any]]] = collections.OrderedDict()
        self.newest: dict[int, int] = {}  # the last step each rank has written

    def add(self, row: dict[str, Any]) -> list[tuple[int, dict[int, dict[str, Any]]]]:
        step, rank = row.get("step"), row.get("rank")
        if self.world == 1 or not isinstance(step, int) or not isinstance(rank, int) or rank < 0:
            return []
        self.newest[rank] = max(self.newest.get(rank, step), step)
        if self.world is None and len(self.newest) < 2:
            # one rank so far and no plan to say more are coming (a log, a single process): nothing to
            # compare, and holding its rows would cost a 15-million-step log a scan per row
            return []
        if step not in self.rows:
            late = bool(self.rows) and step < next(reversed(self.rows))
            self.rows[step] = {}
            if late:  # a rank behind the others opened an earlier step: keep the steps in order
                self.rows = collections.OrderedDict(sorted(self.rows.items()))
        self.rows[step][rank] = row
        want = self.world or max(2, len(self.newest))
        done = []
        while self.rows:
            s = next(iter(self.rows))
            got = self.rows[s]
            ranks_in = len(got) >= want
            # every rank seen that is missing here has written a later step: it will not write this one
            passed = len(self.newest) >= want and all(
                self.newest[r] > s for r in self.newest if r not in got)
            if not (ranks_in or passed or len(self.rows) > self.KEEP):
                break  # steps are judged in order
            done.append((s, self.rows.pop(s)))
        return [(s, got) for s, got in done if len(got) >= 2]

    def rest(self) -> list[tuple[int, dict[int, dict[str, Any]]]]:
        out = [(s, got) for s, got in sorted(self.rows.items()) if len(got) >= 2]
        self.rows.clear()
        return out


def _nonfinite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not finite(value)


def _ranks(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(str(r) for r in ranks)


class NonfiniteOnOneRank(Rule):
    """TG702 nonfinite-on-one-rank: one rank's loss or gradient norm is NaN or inf while the others' are finite.

    ## What it detects
    The first step of the run where some ranks report a non-finite loss (or gradient norm) and the
    other ranks a finite one. That rank is where the bad value started: in data-parallel training its
    NaN gradient is averaged into every rank's by the all-reduce, so from the same step on the others'
    gradient norms, and from the next step their losses, are NaN too. Those are consequences; this
    finding names the origin.

    ## Why it matters
    Every rank's log then shows NaN, and rank 0's (the one people read) says nothing about where it came
    from. The cause is in the data or the state of one rank: its shard of the data (a corrupt sample, an
    all-padding batch), a rank-dependent branch, one device's bad memory.

    ## Example
    `TG702 nonfinite-on-one-rank [error] at step 40: rank 1's loss is nan at step 40 while rank 0's is
    finite (0.912): the first non-finite value of the run is rank 1's`

    ## What to change
    Look at what that rank read at that step: with `guard.batches(loader)` each rank saves the batch of
    its first non-finite step as `nonfinite-step<N>.pt` in the run folder. Check the rank's shard of the
    data and any code that runs on that rank alone.

    ## Known false positives
    None known: a value finite on one rank and not on another at the same step is never healthy.

    ## Options
    Runs where every rank writes the run folder (`trainguard run -- torchrun ...`, or `diagnose` after).
    """

    code, name, severity = "TG702", "nonfinite-on-one-rank", "error"
    needs = (RANKS,)
    status = "preview"
    all_ranks = True

    def __init__(self, plan: dict[str, Any]) -> None:
        super().__init__(plan)
        self.steps = _ByStep(plan)
        self.done = False  # only the run's first non-finite step can name an origin

    def on_step(self, row: dict[str, Any]) -> list[Finding] | None:
        if self.done:
            return None
        out = [f for s, got in self.steps.add(row) if (f := self._judge(s, got)) is not None]
        return out or None

    def end(self) -> list[Finding] | None:
        if self.done:
            return None
        out = [f for s, got in self.steps.rest() if (f := self._judge(s, got)) is not None]
        return out or None

    def _judge(self, step: int, got: dict[int, dict[str, Any]]) -> Finding | None:
        if self.done:
            return None
        for field, what in (("loss", "loss"), ("grad_norm", "gradient norm")):
            values = {r: row.get(field) for r, row in got.items() if isinstance(row.get(field), (int, float))}
            bad = sorted(r for r, v in values.items() if _nonfinite(v))
            if not bad:
                continue
            self.done = True
            good = sorted(r for r in values if r not in bad)
            if not good:
                return None  # every rank at once: not one rank's (the per-rank rules report it)
            shown = {str(r): fmt(values[r]) if r in good else str(values[r]) for r in sorted(values)}
            spread = ""
            if field == "loss":
                grads = {r: row.get("grad_norm") for r, row in got.items()}
                spread_to = sorted(r for r in good if _nonfinite(grads.get(r)))
                if spread_to:
                    spread = (f"; the gradient norm of {_ranks(spread_to)} is non-finite at the same step: the "
                              "all-reduce spread it")
            return self.finding(
                step=step, cause=field,
                summary=f"{_ranks(bad)}'s {what} is {values[bad[0]]} at step {step} while {_ranks(good)}'s "
                        f"{'is' if len(good) == 1 else 'are'} finite ({', '.join(fmt(values[r]) for r in good)}): "
                        f"the first non-finite value of the run is {_ranks(bad)}'s{spread}",
                fix=f"look at what {_ranks(bad)} read at step {step} (its batch is saved as nonfinite-step{step}.pt "
                    "when the loop reads through guard.batches) and at code that runs on that rank alone",
                evidence={"origin_ranks": bad, "finite_ranks": good, "values": shown, "field": field,
                          "detected_step": step},
            )
        return None


class StragglerRank(Rule):
    """TG703 straggler-rank: one rank works longer than the others before each synchronisation.

    ## What it detects
    Each rank's probe measures, per step, the time from the end of the previous step's
    synchronisation (the optimizer step, after DDP's all-reduce) to the start of this step's backward
    (where DDP's all-reduce begins): the work a rank does alone, data loading and forward included. On
    a GPU it is the device's time between those two marks (CUDA events, `presync_device_s`): the host
    runs ahead of its device, and under NCCL waits for a slower rank wherever it next reads a result
    (a `loss.item()` after the step would count as its own work); elsewhere the host's (`presync_s`).
    In data-parallel training the step time is the same on every rank (they leave the all-reduce
    together), so a slow rank shows here: its time before the synchronisation is longer, the others
    spend the difference waiting. The rule looks at the last 20 steps, or the last 5 seconds of steps
    where 20 steps are shorter, and fires when one rank was the slowest in at least 80% of them, by a
    median margin of at least 15% of the run's step time (and 5 ms). The first 20 steps are not judged
    (warm-up; ranks of a shared host still starting).

    ## Why it matters
    The whole job runs at the pace of its slowest rank. A rank that reads from a slower disk, has
    fewer DataLoader workers, does extra work in an `if rank == 0:` branch (logging, evaluation,
    saving every step), or runs on a throttled or shared device costs every rank that share of its time.

    ## Example
    `TG703 straggler-rank [warning] at step 5: rank 1 is a straggler: from step 5 to 24 it took 41 ms
    a step before reaching the all-reduce, the other ranks 6.2 ms (median); they wait ~35 ms a step
    for it, 52% of the step time (67 ms)`

    ## What to change
    Look at what that rank does alone: its data (shard size, storage, loader workers; the rows'
    data_wait per rank), work in rank-dependent branches (move it off the training step or onto a
    thread), its device and host (another job on it, thermal throttling).

    ## Known false positives
    None known for a sustained margin; a one-off (a checkpoint saved by rank 0) is not sustained, nor is
    a burst of load on a shared host (another job took one rank's core for 20 steps of 22 ms, then the
    other's: the 5-second span is there for it).
    Known misses: a model whose forward synchronises (FSDP's all-gather) hides part of the skew in
    the forward; on a GPU, a rank whose device is slower at the same work is seen only where it shows
    before the backward (its forward), not in the backward itself.

    ## Options
    Runs where every rank writes the run folder and the probe watches the model (`trainguard.watch`).
    """

    code, name, severity = "TG703", "straggler-rank", "warning"
    needs = (RANKS,)
    status = "preview"
    all_ranks = True
    WINDOW = 20  # steps judged together, at least
    # ...over at least this much step time: on two shared cores a healthy job's ranks took turns being
    # 1.5x slower for 20 steps (0.45 s) each while other jobs ran; a rank that is slow for a reason of its
    # own (its disk, its branch, its device) stays slow for far longer than this.
    MIN_SPAN_S = 5.0
    SHARE_LAST = 0.8  # the same rank slowest in at least this share of the window
    MIN_MARGIN = 0.15  # ...by at least this share of the step time
    MIN_SECONDS = 0.005
    # The first steps are not judged: allocation, warm-up, and on a shared host the ranks' processes still
    # starting (one rank 2x slower over steps 4-23 of a healthy job, with a second test job beside it
    # on two cores). A straggler worth a warning outlasts them.
    SKIP = 20

    def __init__(self, plan: dict[str, Any]) -> None:
        super().__init__(plan)
        self.steps = _ByStep(plan)
        self.recent: collections.deque[tuple[int, int, float, float, float]] = collections.deque()
        self.slowest: collections.Counter[int] = collections.Counter()  # of the rows in `recent`
        self.span = 0.0  # the step time `recent` covers
        self.reported: set[int] = set()

    def on_step(self, row: dict[str, Any]) -> list[Finding] | None:
        out = [f for s, got in self.steps.add(row) if (f := self._judge(s, got)) is not None]
        return out or None

    @staticmethod
    def _presync(got: dict[int, dict[str, Any]], key: str) -> dict[int, float]:
        pre: dict[int, float] = {}
        for r, row in got.items():
            v = (row.get("extra") or {}).get(key)
            if isinstance(v, (int, float)) and finite(v) and v >= 0:
                pre[r] = float(v)
        return pre

    def _forget(self) -> None:
        self.recent.clear()
        self.slowest.clear()
        self.span = 0.0

    def _judge(self, step: int, got: dict[int, dict[str, Any]]) -> Finding | None:
        if step <= self.SKIP:
            return None
        pre = self._presync(got, "presync_device_s")
        if len(pre) < len(got):  # the device's times where every rank has them, else the host's
            pre = self._presync(got, "presync_s")
        times = [row["step_time"] for row in got.values()
                 if isinstance(row.get("step_time"), (int, float)) and finite(row["step_time"])]
        if len(pre) < 2 or not times:
            self._forget()  # a gap (an evaluation, a step without the measure) breaks the streak
            return None
        slow = max(pre, key=lambda r: pre[r])
        others = median([v for r, v in pre.items() if r != slow])
        step_time = median(times)
        self.recent.append((step, slow, pre[slow], others, step_time))
        self.slowest[slow] += 1
        self.span += step_time
        while len(self.recent) > self.WINDOW and self.span - self.recent[0][4] >= self.MIN_SPAN_S:
            old = self.recent.popleft()
            self.slowest[old[1]] -= 1
            self.span -= old[4]
        if len(self.recent) < self.WINDOW or self.span < self.MIN_SPAN_S:
            return None
        rank, n = self.slowest.most_common(1)[0]
        if rank in self.reported or n < self.SHARE_LAST * len(self.recent):
            return None
        mine = [w for w in self.recent if w[1] == rank]
        own, rest, step_time = (median([w[i] for w in mine]) for i in (2, 3, 4))
        margin = own - rest
        least = max(self.MIN_SECONDS, self.MIN_MARGIN * step_time)
        if margin < least:
            return None
        self.reported.add(rank)
        # where it starts: the window's first step at which this rank was behind by the margin
        first = next(w[0] for w in self.recent if w[1] == rank and w[2] - w[3] >= least)
        last = self.recent[-1][0]
        share = margin / step_time if step_time > 0 else None
        return self.finding(
            step=first, cause=f"rank{rank}",
            summary=f"rank {rank} is a straggler: from step {first} to {last} it took {fmt(own * 1000)} ms a step "
                    f"before reaching the all-reduce, the other ranks {fmt(rest * 1000)} ms (median); they wait "
                    f"~{fmt(margin * 1000)} ms a step for it"
                    + (f", {share:.0%} of the step time ({fmt(step_time * 1000)} ms)" if share is not None else ""),
            fix=f"look at what rank {rank} does alone: its data (shard, storage, loader workers), work in "
                "rank-dependent branches (move it off the training step), its device and host",
            evidence={"rank": rank, "steps": [first, last], "slowest_in": f"{n} of {len(self.recent)} steps",
                      "presync_ms": round(own * 1000, 2), "others_presync_ms": round(rest * 1000, 2),
                      "wait_ms": round(margin * 1000, 2), "step_time_ms": round(step_time * 1000, 2),
                      "detected_step": last},
        )


class GradNormsDiffer(Rule):
    """TG704 grad-norms-differ: DDP ranks report different gradient norms for the same step.

    ## What it detects
    When the watched model is a `DistributedDataParallel`, its all-reduce leaves every rank with the
    same averaged gradients, so the gradient norm the probe measures before each optimizer step
    (sampled steps) is the same number on every rank. This rule fires when the ranks' norms differ by
    more than 0.1% relative on 3 sampled steps in a row: the gradients were not averaged, or were
    changed on one rank after the all-reduce.

    ## Why it matters
    Ranks that step with different gradients train different models (TG701 replicas-diverged follows
    on the parameters). Causes: the forward called on the unwrapped module (`model.module(x)`, the
    model before wrapping), so no all-reduce runs; `no_sync()` on some ranks only; clipping, scaling or
    an extra backward on one rank alone.

    ## Example
    `TG704 grad-norms-differ [error] at step 1: the ranks' gradient norms differ after DDP's
    all-reduce at steps 1, 2, 3: 4.12 on rank 0, 3.87 on rank 1 (6.1% apart at step 1)`

    ## What to change
    Call the DDP-wrapped model for every training forward; make every rank take the same
    synchronisation and clipping path.

    ## Known false positives
    None known: the averaged gradients are equal to the last bit on every rank (float sums in a
    different order would differ by ~1e-7, four orders below the threshold). Only a model watched as a
    `DistributedDataParallel` is checked: FSDP and ZeRO hold a different shard on each rank.

    ## Options
    Runs where every rank writes the run folder and `trainguard.watch` is given the DDP-wrapped model.
    """

    code, name, severity = "TG704", "grad-norms-differ", "error"
    needs = (RANKS,)
    status = "preview"
    all_ranks = True
    TOLERANCE = 1e-3
    IN_A_ROW = 3

    def __init__(self, plan: dict[str, Any]) -> None:
        super().__init__(plan)
        self.ddp = plan.get("model") == "DistributedDataParallel"
        self.steps = _ByStep(plan)
        self.streak: list[tuple[int, dict[int, float], float]] = []
        self.done = False

    def on_step(self, row: dict[str, Any]) -> list[Finding] | None:
        if not self.ddp or self.done or row.get("grad_norm") is None:
            return None
        out = [f for s, got in self.steps.add(row) if (f := self._judge(s, got)) is not None]
        return out or None

    def _judge(self, step: int, got: dict[int, dict[str, Any]]) -> Finding | None:
        norms = {r: row["grad_norm"] for r, row in got.items()
                 if isinstance(row.get("grad_norm"), (int, float)) and finite(row["grad_norm"])}
        if len(norms) < 2:
            return None
        lo, hi = min(norms.values()), max(norms.values())
        apart = (hi - lo) / max(abs(hi), abs(lo), 1e-12)
        if apart <= self.TOLERANCE:
            self.streak = []
            return None
        self.streak.append((step, norms, apart))
        if len(self.streak) < self.IN_A_ROW or self.done:
            return None
        self.done = True
        first, norms0, apart0 = self.streak[0]
        steps = [s for s, _, _ in self.streak]
        return self.finding(
            step=first, cause="grad",
            summary=f"the ranks' gradient norms differ after DDP's all-reduce at steps "
                    f"{', '.join(str(s) for s in steps)}: "
                    + ", ".join(f"{fmt(v)} on rank {r}" for r, v in sorted(norms0.items()))
                    + f" ({apart0:.1%} apart at step {first}): the ranks step with different gradients (not "
                      "averaged, or changed on one rank after the all-reduce)",
            fix="call the DDP-wrapped model for every training forward (not model.module), and keep clipping, "
                "no_sync() and extra backward passes identical on every rank",
            evidence={"steps": steps, "grad_norms": {str(r): v for r, v in sorted(norms0.items())},
                      "relative_difference": round(apart0, 6), "tolerance": self.TOLERANCE,
                      "detected_step": steps[-1]},
        )


class RankStopped(Rule):
    """TG705 rank-stopped: one rank stopped writing steps while the others went on.

    ## What it detects
    A rank whose last row is older than the others' newest by 20 times the run's median step time (and
    5 s), while the others went on past that: at least 3 more steps over at least 2 s after the silence
    began to count. The others kept training (or recording) and this rank did not. Why not a lag alone: a
    rank waiting at a barrier while rank 0 evaluates (the usual DDP evaluation) is silent as long as rank 0,
    and its rows after the barrier reach the store up to a flush later than rank 0's; rank 0's first
    steps after its evaluation say nothing yet. At the end of a run, a rank whose rows end at
    least 3 steps (and 5% of the run) before the others'. A rank whose probe finished (`guard.finish()`:
    uneven data under DDP's `Join`, a rank done with its shard) has not stopped.
    A rank's rows can end before the rank did (over NCCL, its probe's background thread held behind a
    GPU a hung collective wedged): at the end, what it wrote besides its rows, its heartbeat and its
    answer to the watchdog's flight-recorder request, counts as how far it got.

    ## Why it matters
    In lockstep data parallelism the others block in their next collective soon after; where they do
    not (local SGD, asynchronous or rank-local work, a rank that left the loop early on uneven data),
    the job goes on short of a rank. Either way the stopped rank is where to look first, before the hang
    or the wrong result that follows.

    ## Example
    `TG705 rank-stopped [error] at step 10: rank 1 stopped at step 10 (6.2 s before rank 0's step 215)
    while rank 0 went on to step 215`

    ## What to change
    Look at rank 1's output and stack (`trainguard status` shows its heartbeat; a hang finding, if the
    others then block, shows every rank's stack). A rank whose probe switched itself off says so in
    guard.log.

    ## Known false positives
    A job that stops ranks on purpose (elastic scale-down) before it ends.

    ## Options
    Runs where every rank writes the run folder.
    """

    code, name, severity = "TG705", "rank-stopped", "error"
    needs = (RANKS,)
    status = "preview"
    all_ranks = True
    BEHIND = 3
    PACE_TIMES = 20
    MIN_SECONDS = 5.0
    GONE_ON_SECONDS = 2.0  # how long the others must have kept stepping past the silence's limit

    def __init__(self, plan: dict[str, Any]) -> None:
        super().__init__(plan)
        self.last: dict[int, tuple[int, float]] = {}  # rank -> (its last step, the time of its row)
        self.pace: collections.deque[float] = collections.deque(maxlen=200)
        self.reported: set[int] = set()
        self.finished: set[int] = set()  # ranks whose probe finished: done, not stopped
        # (silent rank, its last step) -> the others' first (step, time) past the silence's limit
        self.beyond: dict[tuple[int, int], tuple[int, float]] = {}
        # rank -> the last step it finished by what it wrote besides its rows (`STEPS_REACHED`, at the end)
        self.reached: dict[int, int] = {}

    def on_event(self, event: dict[str, Any]) -> None:
        if event.get("kind") == "probe" and event.get("name") == "finish" and isinstance(event.get("rank"), int):
            self.finished.add(event["rank"])
        elif event.get("kind") == STEPS_REACHED and isinstance(event.get("data"), dict):
            for rank, step in event["data"].items():
                if str(rank).isdigit() and isinstance(step, int):
                    self.reached[int(rank)] = max(self.reached.get(int(rank), step), step)

    def on_step(self, row: dict[str, Any]) -> Finding | None:
        step, rank, t = row.get("step"), row.get("rank"), row.get("t")
        if not isinstance(step, int) or not isinstance(rank, int) or rank < 0 or not isinstance(t, (int, float)):
            return None
        self.last[rank] = (step, t)
        if any(k[0] == rank for k in self.beyond):  # this rank is heard from again: not silent
            self.beyond = {k: v for k, v in self.beyond.items() if k[0] != rank}
        if isinstance(row.get("step_time"), (int, float)) and finite(row["step_time"]):
            self.pace.append(row["step_time"])
        if len(self.last) < 2:
            return None
        limit = max(self.MIN_SECONDS, self.PACE_TIMES * (median(list(self.pace)) if self.pace else 0.0))
        for other, (o_step, o_t) in self.last.items():
            if other in self.reported or other in self.finished or step - o_step < self.BEHIND or t - o_t < limit:
                continue
            first_step, first_t = self.beyond.setdefault((other, o_step), (step, t))
            if step - first_step >= self.BEHIND and t - first_t >= self.GONE_ON_SECONDS:
                return self._stopped(other, o_step, t - o_t, rank, step)
        return None

    def end(self) -> Finding | None:
        if len(self.last) < 2:
            return None
        # a rank's rows may end before it did (its background thread held behind a wedged GPU): its
        # heartbeat or its flight-recorder answer says how far it got
        last = {rank: max(step, self.reached.get(rank, step)) for rank, (step, _) in self.last.items()}
        newest_rank, newest = max(last.items(), key=lambda kv: kv[1])
        margin = max(self.BEHIND, int(0.05 * (self.total_steps or newest)))
        for other, o_step in sorted(last.items()):
            if other not in self.reported and other not in self.finished and newest - o_step >= margin:
                return self._stopped(other, o_step, None, newest_rank, newest)
        return None

    def _stopped(self, rank: int, step: int, ago: float | None, ahead: int, ahead_step: int) -> Finding:
        self.reported.add(rank)
        when = f" ({fmt(ago)} s before rank {ahead}'s step {ahead_step})" if ago is not None else ""
        return self.finding(
            step=step, cause=f"rank{rank}",
            summary=f"rank {rank} stopped at step {step}{when} while rank {ahead} went on to step {ahead_step}",
            fix=f"look at rank {rank}'s output and stack (trainguard status; a hang finding shows every rank's "
                "stack) and at guard.log if its probe switched itself off",
            evidence={"rank": rank, "last_step": step, "others_step": ahead_step,
                      "seconds_behind": round(ago, 1) if ago is not None else None, "detected_step": ahead_step},
        )
