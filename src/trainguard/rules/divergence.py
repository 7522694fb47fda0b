"""TG206-TG208: a loss that climbs from its best, jumps for a moment, or leaves its start far behind."""

from __future__ import annotations

import bisect
import collections
import math
from typing import Any

from trainguard.findings import LOSS, UPDATE_RATIO, Finding
from trainguard.rules.rule import Rule, finite, fmt, median, robust_std
from trainguard.rules.schedule import step_lr


class _Blocks:
    """The divergence test on one series: block medians, the best block, and the bar above it.

    Blocks are (first step, last step, median, noise). Only these are kept, not every block: a list of
    all of them grows with the log, and a scan of it at every block makes a long log quadratic.
    """

    def __init__(self, k: int) -> None:
        self.k = k
        self.block: list[float] = []
        self.block_start = 0  # the first step of the block being filled (set by its first value)
        self.count = 0  # blocks so far
        self.first: float | None = None  # the first block's median: where the run started
        self.recent: collections.deque[tuple[int, int, float, float]] = collections.deque(maxlen=3)
        self.best: tuple[int, int, float, float] | None = None  # the lowest block before the last two
        self.need = 0.0  # how far above the best a block must be to count as diverged
        self.onset: tuple[int, int, float, float] | None = None  # the first block after the best above half that

    def add(self, step: int, value: float) -> tuple[Any, ...] | None:
        """Adds a value; (best, latest, previous, onset, need, first) once the last two blocks diverged."""
        if not self.block:
            self.block_start = step
        self.block.append(value)
        if len(self.block) < self.k:
            return None
        blk = (self.block_start, step, median(self.block), robust_std(self.block))
        self.block = []
        self.count += 1
        if self.first is None:
            self.first = blk[2]
        self.recent.append(blk)
        if self.count >= 3:
            # the best block before the last two, kept as blocks age into that range
            aged = self.recent[0]
            if self.best is None or aged[2] < self.best[2]:
                self.best, self.onset = aged, None
                self.need = max(3 * aged[3], 0.5 * abs(aged[2]), 0.25 * (self.first - aged[2]))
                after = [self.recent[1], self.recent[2]]  # every block after a new best
            else:
                after = [blk]  # the best and its bar are unchanged: only the new block is news
            # The onset is the first block after the best that rose by half the bar. The best changes
            # only to the block that just aged, so the blocks after it are always the last two, then
            # each new one: watching them as they come finds the onset a scan of all blocks would.
            for cand in after:
                if self.onset is None and cand[0] > self.best[1] and cand[2] > self.best[2] + 0.5 * self.need:
                    self.onset = cand
        if self.count < 4:
            return None
        best, need = self.best, self.need
        if best is None:  # (there is one from the third block on)
            return None
        b, c = self.recent[1], self.recent[2]
        if c[2] - best[2] <= need or b[2] - best[2] <= need:
            return None
        return best, c, b, self.onset or c, need, self.first  # c itself clears the bar: an onset was seen


FEW_ROWS = 16  # fewer loss rows than this: judged at the end by `LossDiverging.end`
FEW_RISE = 1.3  # every training row after the best, and the evaluations' median, this far above their best
FEW_EVAL_RISE = 1.2  # the last evaluation


class LossDiverging(Rule):
    """TG206 loss-diverging: the loss climbs back up, well above the best level it reached.

    ## What it detects
    The loss is summarised by block medians (blocks of 2% of the planned run, 10 to 50 steps). The
    rule fires when the two latest blocks are both above the best earlier block by more than the
    largest of: 3x that block's noise, half the best level, and a quarter of the progress the run had
    made (first block minus best). When the loop reports the weights of its loss parts and they
    change (a curriculum), the weighted total rises by design: the rule then judges each part on its
    own, unweighted, and fires only for a part that climbs by the same test and whose climb, at its
    weight now, would clear the total's own bar; the weights explain the rest.

    ## Why it matters
    A loss that turns round and climbs is usually heading for NaN: an LR too high for this stage, a
    warmup too short, an optimizer state gone bad. Caught early, the run can be stopped and resumed
    from the checkpoint before the climb with a lower LR.

    ## Example
    `TG206 loss-diverging [error] at step 501: the loss rose from its best 0.412 (steps 481-500) to 2.45
    (steps 521-540) and stays there (median 3.12 over steps 501-520)`

    ## What to change
    Lower the peak LR or lengthen the warmup, clip gradients, and resume from the last good checkpoint.

    ## Known false positives
    A curriculum that deliberately switches to harder data (the loss of the new data is higher); one
    whose weights are applied but not reported.

    ## Options
    A run with 4 to 15 loss rows (too few for blocks) is judged at its end (cause `few-rows`): every
    training row after its best at least 1.3x the best, and the evaluation loss rising with it (the
    evaluations after the best training row 1.3x the best before it in median, the last 1.2x).

    Not judged for a job watched with `trainguard.watch(..., learning=False)`.
    """

    code, name, severity = "TG206", "loss-diverging", "error"
    needs = (LOSS,)

    def __init__(self, plan: dict[str, Any]) -> None:
        super().__init__(plan)
        self.k = self.window(0.02, 10, 50) if self.total_steps else 25
        self.total = _Blocks(self.k)
        self.parts: dict[str, _Blocks] = {}
        self.first_weights: dict[str, float] = {}
        self.weighted = False  # the reported weights changed: the total is judged through its parts
        self.rows: list[tuple[int, float]] = []  # the first training losses, for a run too short for blocks
        self.evals: list[tuple[Any, float]] = []  # its evaluation losses
        self.said = False

    def on_event(self, event: dict[str, Any]) -> None:
        value = (event.get("data") or {}).get("loss")
        # only while the run can still be a short one (bounded state on a long log)
        if event.get("kind") == "eval" and finite(value) and len(self.rows) < FEW_ROWS and len(self.evals) < 2000:
            self.evals.append((event.get("step"), float(value)))

    def end(self) -> Finding | None:
        """A run whose loss rows are too few for blocks (the Trainer logging every 500 of 2,640 steps: five
        rows), judged once at its end: its training loss ends well above its best row and never came back near
        it, and the evaluation loss says the same (the evaluations after the best training row well above the
        best before it). Both rising is a divergence; a training loss that falls while the evaluation loss
        rises is overfitting, and not this."""
        rows = self.rows
        if self.said or not self.learning or not 4 <= len(rows) < FEW_ROWS:
            return None
        b = min(range(len(rows)), key=lambda i: rows[i][1])
        best_step, best = rows[b]
        after = [v for _, v in rows[b + 1:]]
        if best <= 0 or len(after) < 2 or min(after) < FEW_RISE * best:
            return None
        before = [v for s, v in self.evals if isinstance(s, (int, float)) and s <= best_step]
        later = [v for s, v in self.evals if isinstance(s, (int, float)) and s > best_step]
        if not before or len(later) < 3:
            return None
        e_best = min(before)
        if median(later) < FEW_RISE * e_best or later[-1] < FEW_EVAL_RISE * e_best:
            return None
        return self.finding(
            step=best_step, cause="few-rows",
            summary=f"the loss rose from its best {fmt(best)} (step {best_step}) to {fmt(max(after))} and never came "
                    f"back near it ({fmt(after[-1])} at step {rows[-1][0]}, {len(after)} rows after the best); the "
                    f"evaluation loss rose with it, from {fmt(e_best)} to a median of {fmt(median(later))} over "
                    f"{len(later)} evaluations, ending at {fmt(later[-1])}",
            fix="lower the peak LR or lengthen the warmup, clip gradients, resume from the last good checkpoint",
            evidence={"best": best, "best_step": best_step, "after": after, "eval_best": e_best,
                      "eval_later_median": median(later), "eval_last": later[-1], "detected_step": rows[-1][0]},
        )

    def on_step(self, row: dict[str, Any]) -> Finding | None:
        if not self.learning:
            return None
        if finite(row.get("loss")) and len(self.rows) < FEW_ROWS:
            self.rows.append((row["step"], float(row["loss"])))
        weights = row.get("weights") or {}
        for name, w in weights.items():
            if finite(w) and abs(self.first_weights.setdefault(name, w) - w) > 1e-9 * max(1.0, abs(w)):
                self.weighted = True
        found = None
        loss = row.get("loss")
        if finite(loss):
            got = self.total.add(row["step"], loss)
            if got is not None and not self.weighted:
                found = self._found(row, got, "the loss", None, weights)
                self.said = True
        for name, value in (row.get("parts") or {}).items():
            if finite(value) and (name in self.parts or len(self.parts) < 16):
                got = self.parts.setdefault(name, _Blocks(self.k)).add(row["step"], value)
                if got is None or not self.weighted or found is not None or self.total.best is None:
                    continue
                # the part's climb must matter to the total: its rise, at its weight now, past the bar the
                # total itself would have to clear
                w = weight if finite(weight := weights.get(name)) else 1.0
                if abs(w) * (got[1][2] - got[0][2]) > self.total.need:
                    found = self._found(row, got, f"loss part {name}", f"part-{name}", weights)
        return found

    def _found(self, row: dict[str, Any], got: tuple[Any, ...], what: str, cause: str | None,
               weights: dict[str, Any]) -> Finding:
        best, c, b, onset, need, first = got
        note = (" (judged unweighted: the reported weights change over the run, and explain only their own "
                "share of the total)" if cause else "")
        return self.finding(
            step=onset[0], cause=cause,
            summary=f"{what} rose from its best {fmt(best[2])} (steps {best[0]}-{best[1]}) to {fmt(c[2])} "
                    f"(steps {c[0]}-{c[1]}) and stays there (median {fmt(b[2])} over steps {b[0]}-{b[1]}){note}",
            fix="lower the peak LR or lengthen the warmup, clip gradients, resume from the last good checkpoint",
            evidence={"best": best[2], "best_steps": [best[0], best[1]], "latest": c[2],
                      "latest_steps": [c[0], c[1]], "first": first, "threshold": need,
                      "weights": {k: v for k, v in weights.items() if finite(v)} if cause else None,
                      "detected_step": row["step"]},
        )


class LossDiverged(Rule):
    """TG208 loss-diverged: the loss far above where it started, with updates far larger than weights take.

    ## What it detects
    The median of the last 5 losses more than 10x the run's initial loss (with the model's output size
    V known: the lowest of its first 3, the first computed before any update, and more than 10x ln(V),
    a uniform guess's loss; without it: the highest of the first 3, so a noisy loss's lucky first
    draw is no start), while the probe's sampled update-to-weight ratios in those
    steps say why: one of them above 0.1 (each step changed the sampled weights by a tenth of their
    norm or more; about 1e-3 is typical for Adam), or 10x above the run's own median ratio before the
    climb. No NaN is needed: a loss that settles at hundreds of times a uniform guess's never becomes one.
    It decides once.

    ## Why it matters
    An LR off by orders of magnitude (2 typed for 2.5e-4, OpenNMT/OpenNMT-tf#744) throws the weights
    around from the first update: the loss jumps and stays far above where it started, and a
    NaN-only check says nothing for the rest of the run. `loss-diverging` needs a best level first
    to climb from; this needs only the start.

    ## Example
    `TG208 loss-diverged [error] at step 2: the loss went from 5.85 at its start to 181 (median of
    steps 3-7), 31x, while the updates changed the weights by 3.02, 0.653, 0.346 of their norm (about
    1e-3 is typical; above 0.1 diverges) at lr 2; gradient norm 0.837 -> 42.1`

    ## What to change
    Lower the LR (the ratio says by how much: a ratio of 1 at an LR of 2 asks for about 1e-3 of it),
    add a warm-up, clip gradients; check the LR's units (a value meant for SGD given to Adam).

    ## Known false positives
    A loss that grows by design (a reinforcement-learning loss that scales with the returns, a
    curriculum that switches a loss part on at full weight) while the weights happen to move fast.
    Update ratios are large too where the weights shrink towards zero (a regression converging to a
    zero weight): the loss has to climb tenfold as well.

    ## Options
    `trainguard.watch(stats_every=N)` sets how often the update ratio is sampled.
    """

    code, name, severity = "TG208", "loss-diverged", "error"
    needs = (LOSS, UPDATE_RATIO)
    RISE = 10.0  # the recent median over the initial loss
    TOO_LARGE = 0.1  # an update a tenth of the weights' norm: 100x Adam's typical 1e-3
    OWN_JUMP = 10.0  # or this many times the run's own median ratio before the climb

    def __init__(self, plan: dict[str, Any]) -> None:
        super().__init__(plan)
        self.first: list[tuple[int, float, Any, Any]] = []  # step, loss, lr, grad norm of the first 3 steps
        self.recent: collections.deque[tuple[int, float]] = collections.deque(maxlen=5)
        self.ratios: collections.deque[tuple[int, float, Any, Any]] = collections.deque(maxlen=8)  # since the climb
        self.calm: collections.deque[tuple[int, float, Any, Any]] = collections.deque(maxlen=50)  # before it
        size = plan.get("output_size")
        self.size = int(size) if finite(size) and size >= 2 else None  # ln(V): a uniform guess's loss
        self.done = False

    def on_step(self, row: dict[str, Any]) -> Finding | None:
        if self.done or not self.learning:
            return None
        loss, ratio = row.get("loss"), row.get("update_ratio")
        if not finite(loss):
            return None
        step = row["step"]
        if len(self.first) < 3:
            self.first.append((step, float(loss), step_lr(row), row.get("grad_norm")))
        # Where the loss started. With the output size known (a classifier, a language model), the lowest of
        # the first three, held to ln(V) too below; without it, the highest: a noisy loss (a regression on
        # random inputs) may draw a first value 20x under its level, and "10x its start" must not be that.
        start = (min if self.size else max)(v for _, v, _, _ in self.first)
        if start <= 0:
            self.done = True  # a loss that can be zero or negative has no "times its start"
            return None
        self.recent.append((step, float(loss)))
        sample = (step, float(ratio), step_lr(row), row.get("grad_norm")) if finite(ratio) else None
        if loss > 3 * start:
            if not self.ratios and self.calm and self.calm[-1][0] == step - 1:
                # the update of the step before the climb's first loss made that loss: it is the climb's
                self.ratios.append(self.calm.pop())
            if sample is not None:
                self.ratios.append(sample)
        else:
            self.ratios.clear()
            if sample is not None:
                self.calm.append(sample)
        if len(self.recent) < 5 or len(self.first) < 3:
            return None
        level = median([v for _, v in self.recent])
        if level <= self.RISE * start or (self.size and level <= self.RISE * math.log(self.size)):
            return None
        own = median([r for _, r, _, _ in self.calm]) if len(self.calm) >= 3 else None
        big = [r for r in self.ratios if r[1] > self.TOO_LARGE or (own is not None and r[1] > self.OWN_JUMP * own
                                                                    and r[1] > 0.01)]
        if not big:
            return None
        self.done = True
        onset = next((s for s, v in self.recent if v > 3 * start), self.recent[0][0])
        onset = min(onset, self.ratios[0][0])
        lr = next((r[2] for r in reversed(big) if finite(r[2])), step_lr(row))
        first_gn = next((g for _, _, _, g in self.first if finite(g)), None)
        last_gn = max((g for _, _, _, g in self.ratios if finite(g)), default=None)
        shown = ", ".join(fmt(r[1]) for r in list(self.ratios)[:5])
        own_words = f"; this run's own median before the climb was {fmt(own)}" if own is not None else ""
        gn = (f"; gradient norm {fmt(first_gn)} -> {fmt(last_gn)}" if first_gn is not None and last_gn is not None
              else "")
        at_lr = f" at lr {fmt(lr)}" if finite(lr) else ""
        return self.finding(
            step=onset, cause="update-too-large",
            summary=f"the loss went from {fmt(start)} at its start to {fmt(level)} (median of steps "
                    f"{self.recent[0][0]}-{self.recent[-1][0]}), {level / start:.0f}x, while the updates changed the "
                    f"weights by {shown} of their norm (about 1e-3 is typical; above 0.1 diverges{own_words}){at_lr}"
                    f"{gn}: the LR is far too high for this model",
            fix=f"lower the LR{' (' + fmt(lr) + ')' if finite(lr) else ''} by 10x-1000x, add a warm-up and clip "
                "gradients; check its units (an SGD value given to Adam, a typo in the exponent)",
            evidence={"initial_loss": start, "loss_median": level, "ratio": level / start,
                      "steps": [self.recent[0][0], self.recent[-1][0]],
                      "update_ratios": [[s, r] for s, r, _, _ in self.ratios], "own_median_ratio": own,
                      "lr": lr, "grad_norm_first": first_gn, "grad_norm_max": last_gn, "detected_step": step},
        )


class LossSpike(Rule):
    """TG207 loss-spike: one step's loss far above the run's recent losses, beyond the run's own noise tail.

    ## What it detects
    Judged in log space (a loss's noise grows with its level, and a jump is a ratio): the log of a
    loss against the median log of the last 50 steps. A spike is more than 10 robust standard
    deviations of those logs above it, and above the run's own noise tail by a factor of 4 (the 99th
    percentile of how far its losses have stood above their recent median so far: a run whose
    per-batch losses often jump 6x needs a jump past 24x). It must also matter on the run's scale:
    above the median by more than 50% of it and by more than 5% of the run's starting loss. Needs 30
    steps. A spike an order of magnitude larger than any reported before is reported again, so the
    largest one is never hidden behind a small first one, once the loss has come back down in between
    (a loss that keeps climbing is `loss-diverging`'s). Losses at or below zero are judged in
    linear terms (10 robust standard deviations).

    ## Why it matters
    A spike is a bad batch (corrupt sample, wrong label scale, an outlier sequence length), a numerical
    hiccup, or the first sign of instability; large spikes leave the optimizer's moments polluted
    for many steps. Knowing the step lets you find the batch.

    ## Example
    `TG207 loss-spike [warning] at step 16149: loss 126 against a median of 0.0502 over the last 50
    steps (2,504x; 99% of this run's rises above its median stay below 2x)`

    ## What to change
    Look at the batch of that step (`guard.batches` records which one it was); clip gradients; skip or
    fix the sample.

    ## Known false positives
    A loss that changes definition mid-run (a new loss part switched on at full weight).

    ## Options
    None.
    """

    code, name, severity = "TG207", "loss-spike", "warning"
    needs = (LOSS,)
    TAIL_FACTOR = 4.0  # a spike stands this many times further above the median than the run's own 99th percentile
    BIN = 0.02  # log-space width of the tail histogram's bins; 1,000 bins reach e^20

    def __init__(self, plan: dict[str, Any]) -> None:
        super().__init__(plan)
        self.hist: collections.deque[float] = collections.deque(maxlen=50)
        self.ordered: list[float] = []  # the same 50 losses, sorted: the median without a sort per step
        self.start: list[float] = []
        self.start_median: float | None = None
        self.tail = [0] * 1000  # how far (log) each loss stood above its recent median: a bounded histogram
        self.tail_n = 0
        self.reported_order = -1  # the order of magnitude of the largest spike reported so far
        self.settled = True  # the loss came back near its median after the last spike reported

    def _tail_quantile(self, q: float = 0.99) -> float:
        need, seen = q * self.tail_n, 0
        for i, c in enumerate(self.tail):
            seen += c
            if seen >= need:
                return (i + 1) * self.BIN
        return len(self.tail) * self.BIN

    def on_step(self, row: dict[str, Any]) -> Finding | None:
        loss = row.get("loss")
        if not finite(loss):
            return None
        found = None
        if len(self.start) < 10:
            self.start.append(loss)
            if len(self.start) == 10:
                self.start_median = median(self.start)
        n = len(self.ordered)
        if n >= 30:
            assert self.start_median is not None  # the first 10 losses came before these 30
            s = self.ordered
            med = s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])
            positive = s[0] > 0 and loss > 0
            rise = math.log(loss / med) if positive else None
            jump = loss - med
            if not self.settled and loss <= 3 * med:
                self.settled = True
            # A jump must also matter on the run's own scale: 5% of where its loss started (30 steps
            # in, the 10 starting losses are in). These two bars are cheap; the robust std costs two
            # sorts and is worked out only for a loss that clears them.
            if jump > 0.5 * abs(med) and jump > 0.05 * abs(self.start_median):
                found = self._judge(row, loss, med, rise)
            if rise is not None and rise > 0:  # into the tail after it was judged against the tail before it
                self.tail[min(len(self.tail) - 1, int(rise / self.BIN))] += 1
                self.tail_n += 1
        if len(self.hist) == self.hist.maxlen:
            del self.ordered[bisect.bisect_left(self.ordered, self.hist[0])]  # the loss about to leave
        self.hist.append(loss)
        bisect.insort(self.ordered, loss)
        return found

    def _judge(self, row: dict[str, Any], loss: float, med: float, rise: float | None) -> Finding | None:
        values = list(self.hist)
        if rise is not None:
            logs = [math.log(v) for v in values]
            sd = max(robust_std(logs), 1e-3)
            tail = self._tail_quantile()
            if rise <= 10 * sd or rise <= tail + math.log(self.TAIL_FACTOR):
                return None
            ratio = loss / med
            order = int(math.log10(ratio))
            if order <= self.reported_order:
                return None
            if self.reported_order >= 0 and not self.settled:
                return None  # the loss never came back down since the last one: a climb, not isolated spikes
            first, self.reported_order, self.settled = self.reported_order < 0, order, False
            return self.finding(
                step=row["step"], cause=None if first else f"1e{order}",
                summary=f"loss {fmt(loss)} against a median of {fmt(med)} over the last {len(values)} steps "
                        f"({ratio:,.0f}x; 99% of this run's rises above its median stay below {math.exp(tail):.2g}x)",
                fix="look at that step's batch; clip gradients; skip or fix the sample",
                evidence={"loss": loss, "median": med, "ratio": ratio, "log_robust_std": sd,
                          "tail_99_ratio": math.exp(tail), "detected_step": row["step"]},
            )
        sd = max(robust_std(values), 1e-3 * abs(med), 1e-12)
        if loss - med <= 10 * sd or self.reported_order >= 0:
            return None
        self.reported_order = 0
        return self.finding(
            step=row["step"],
            summary=f"loss {fmt(loss)} against a median of {fmt(med)} over the last {len(values)} "
                    f"steps (robust std {fmt(sd)})",
            fix="look at that step's batch; clip gradients; skip or fix the sample",
            evidence={"loss": loss, "median": med, "robust_std": sd, "detected_step": row["step"]},
        )
