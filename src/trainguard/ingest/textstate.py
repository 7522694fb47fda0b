"""Where one pass over a text log stands, and how it ends: the state `ingest.textlog`'s `_LineParser` keeps.

`_ParserState` holds that state and the judgements made of it, apart from reading a line's records:
- positions: the run's one step axis (a sample counter becomes batches, a counter that restarts each epoch
  becomes absolute), the epochs seen, the plan a printed setting states, and a launch boundary (a shell
  prompt, or the positions returning to the log's first one);
- the ending: the traceback being read, and at the end of the log the run held against its plan (finished,
  or "cut off at epoch 17 of 200 (8%)"), or a last evaluation off its cadence.
"""

from __future__ import annotations

import math
import re
from typing import Any

from trainguard.ingest.events import Facts, launch_event
from trainguard.ingest.textlines import (
    _BRACKET,
    _EPOCH_AT,
    _EPOCH_ITER,
    _EXCEPTION_LINE,
    _PROGRESS,
    _STEP,
    _norm,
    contracts,
)

TRACEBACK_LINES = 400  # lines kept of one traceback
LAUNCH_ERROR_TAIL = 20  # lines after a launch's refusal that can only be another launch's (a wrapper adds a few)


class _ParserState:
    """The state of one pass over a log: the step count, tqdm's epoch offset, the open traceback, the plan
    and how far the run got against it; the positions and the ending judged from them."""

    def __init__(self, facts: Facts) -> None:
        self.facts = facts
        self.step = 0  # the last step emitted
        self.bar_offset = 0
        self.bar_last = 0
        self.bar_total = 0
        self.plan_total: int | None = None
        self.tb: list[str] | None = None
        self.quoted: str | None = None  # the line prefix of a traceback a logger quotes as a warning
        self.resumed_after: list[str] | None = None  # the traceback a relaunch from a checkpoint followed
        self.abbr_last: int | None = None  # the last step a big-number print stood for (`step:1K`)
        self.abbr_every: int | None = None  # the cadence of the steps printed exactly before the rounding began
        self.first_epoch: int | None = None  # the first epoch number seen: a per-epoch counter counts from it
        self.usage = False  # inside argparse's `usage:` block
        self.last_eval: tuple[int | None, dict[str, float]] = (None, {})
        self.c = contracts()
        # the plan the log states, and where the run got: epochs as printed (`Epoch 17/200`, a config's
        # `epochs: 400`), the highest epoch seen and whether epochs count from 0
        self.plan_steps: int | None = None  # from a printed setting (`max_iters = 3000`)
        self.plan_epochs: int | None = None  # from a printed setting (`epochs: 400`)
        self.epochs_of: int | None = None  # from `Epoch E/N` itself (it wins over a setting)
        self.epoch_max: int | None = None
        self.epoch_zero = False  # an epoch 0 was seen: the last planned epoch is N - 1
        self.kv: dict[str, float] = {}  # the rows of an OpenAI logger table being read
        self.best: dict[str, float] = {}  # EarlyStopping's last printed best per monitored metric
        self.eval_steps: list[int] = []  # the steps of the evaluations (first few and the last ones)
        self.per_epoch: dict[int, int] = {}  # I-JEPA: the largest iteration seen in each epoch
        self.sample_unit: int | None = None  # a sample counter's smallest increment (one printed interval)
        self.batch_size: int | None = None  # a printed `batch_size` setting: a sample counter's unit
        self.iter_max = 0  # the largest iteration within an epoch seen (`[E, I]` lines without `/n`)
        self.epoch_at: tuple[int, int] | None = None  # (epoch, step within it) of the last such line
        self.steps_per_epoch: int | None = None  # a step counter that restarts each epoch: its `/n`
        self.bar_seen = 0  # the furthest training progress bar drawn, metrics or not (a bar is a position)
        self.epoch_axis = False  # the log's only loss is its epoch summaries: steps are epochs
        self.relaunch: int | None = None  # the last step of a relaunch not yet past the earlier launch's steps
        self.pending: tuple[int, int] | None = None  # (line, step) of a step printed alone: the next line's record
        self.lineno = 0
        self.table: tuple[str, ...] | None = None  # the columns of a table without names on its rows, once opened
        self.closing: str | None = None  # a closing line (declared `closing`) no training step has followed yet
        # a launch started at a shell prompt: how the launch before it stood, kept in case this one never trains
        self.before_launch: dict[str, Any] | None = None
        self.after_launch_error = 0  # non-blank lines printed after argparse's `error:` line
        self.steps_at_launch = 0
        self.trained = 0  # training rows seen, kept or not (a relaunch's rows below the steps read are dropped)
        # the position (epoch, iteration or step) of the log's first training row, and whether a later row got
        # past it: a training row back at that position after that begins another launch (see `_returns`)
        self.first_pos: tuple[int, ...] | None = None
        self.advanced = False
        self.queued: list[dict[str, Any]] = []  # `launch` events, handed out before the line's own events
        self.block: tuple[int, dict[str, float]] | None = None  # an open multi-line record: its step, its metrics
        self.block_rows = 0  # the lines that continued a record
        self.bar_epoch_first: int | None = None  # the epoch the first `Epoch N:` bar named

    def _new_launch(self) -> None:
        """A shell prompt and a command: what follows is another launch (an inference script after training, a
        relaunch). The log is judged on its last launch that trains; how the one before stood is kept for the
        case that this one never logs a training step."""
        self.queued.append(launch_event(self.step, "launch"))
        if self.trained > self.steps_at_launch:  # the launch now closing trained: the one to fall back on
            self.before_launch = {"completed": self.facts.completed, "epoch_max": self.epoch_max,
                                  "epoch_zero": self.epoch_zero, "epochs_of": self.epochs_of,
                                  "plan_epochs": self.plan_epochs, "plan_steps": self.plan_steps,
                                  "plan_total": self.plan_total, "closing": self.closing,
                                  "ends_with": self.facts.ends_with, "cut_off": self.facts.cut_off,
                                  "eval_steps": self.eval_steps, "traceback": self.facts.traceback}
        elif self.before_launch is not None and self.facts.traceback is not None:
            # a launch that crashed before it trained, after one that trained: the earlier one stays the run
            # unless a later launch trains, and then neither crash is that launch's ending
            self.before_launch["traceback"] = self.before_launch.get("traceback") or self.facts.traceback
        self.facts.traceback = None  # an earlier launch's crash is not the ending of the launch that follows
        self.steps_at_launch = self.trained
        self.facts.completed = None
        self.closing = None
        self.epoch_max, self.epochs_of, self.epoch_zero = None, None, False
        self.eval_steps = []  # the cadence of this launch's evaluations, not the last launch's

    def _returns(self, line: str, epoch: tuple[int, int | None] | None, step: int | None) -> None:
        """A launch boundary the positions themselves show: a training row back at the log's first position
        (its epoch and iteration, or its printed step) after the log had got past it is another launch of the
        script appended to the same file (a restart from scratch, typically after its config is printed
        again). A resumed run goes on from a later position: it never returns to the first one."""
        # with its epoch when the line names one: a counter within the epoch restarts at each epoch
        at = _EPOCH_AT.search(line) if epoch is not None else None
        if at is not None:
            pos: tuple[int, ...] = (int(at.group(1)), int(at.group(2)))
        elif epoch is not None:
            pos = (epoch[0], step if step is not None else -1)
        elif step is not None and self.epoch_max is not None:
            pos = (self.epoch_max, step)  # under an epoch's heading (`Epoch 3/10` printed on its own line)
        elif step is not None:
            pos = (step,)
        else:
            return
        first = self.first_pos
        if first is None or len(first) != len(pos):
            if first is None:
                self.first_pos = pos
            return
        if pos > first:
            self.advanced = True
        elif self.advanced:
            self._new_launch()
            # the new launch's rows count from its own start: none is dropped as a step already read
            self.step, self.bar_offset, self.bar_last, self.relaunch, self.pending = 0, 0, 0, None, None
            self.advanced = False

    def _epoch_seen(self, epoch: int, of: int | None) -> None:
        """Any line naming its epoch (`Epoch 3/500`, `End of epoch 16 / 200`): how far the run got."""
        if of is not None and 0 < of and epoch <= of:
            self.epochs_of = of
        if epoch == 0:
            self.epoch_zero = True
        if of is not None and epoch > of:
            return  # not an epoch position (`epoch 5/3` is no position)
        self.epoch_max = epoch  # the latest: a relaunch appended starts again

    def _position(self, line: str, epoch: tuple[int, int | None] | None, train: bool) -> int | None:
        """The step of a metric line, on the run's one step axis: a declared sample counter becomes batches,
        `[epoch, iter]` and per-epoch counters become absolute; an evaluation's own progress
        (`Epoch(val) [1][5/5]`) counts evaluation batches, not steps."""
        if train:
            for pattern in self.c.samples:
                if (m := pattern.search(line)) is not None and _counts(m):
                    return self._samples(int(m.group(1)), int(m.group(2)), int(m.group(3)))
            if "," in line and (m := _EPOCH_ITER.search(line)) is not None and _counts(m):
                return self._epoch_iter(int(m.group(1)), int(m.group(2)), int(m.group(3)) if m.group(3) else None)
        return self._step_of(line, epoch if train else None, progress=train)

    def _samples(self, epoch: int, done: int, size: int) -> int:
        """`Train Epoch: 2 [640/60000 (1%)]`: samples, not steps. With the batch size printed (`--batch-size 64`,
        `batch_size=64`) the step is the batch; without it, the counter's smallest increment (one log
        interval's samples) is the unit, so the steps are printed intervals, evenly spaced and made absolute."""
        if done > 0:
            self.sample_unit = done if self.sample_unit is None else math.gcd(self.sample_unit, done)
        unit = self.batch_size or self.sample_unit or 1
        if self.first_epoch is None:
            self.first_epoch = epoch
        per = -(-size // unit)  # units in one epoch
        return max(0, epoch - self.first_epoch) * per + done // unit + 1

    def _epoch_iter(self, epoch: int, it: int, per: int | None) -> int:
        """`[19,  2125/ 2562]`: the iteration within the epoch, made absolute (per epoch: the `/n`, else the
        largest iteration seen)."""
        self.iter_max = max(self.iter_max, it)
        if self.first_epoch is None:
            self.first_epoch = epoch
        self._epoch_seen(epoch, None)
        return max(0, epoch - self.first_epoch) * (per or self.iter_max + 1) + it

    def _step_of(self, line: str, epoch: tuple[int, int | None] | None, progress: bool = True) -> int | None:
        """The optimizer step a metric line is at: `step 120`, `Step 5/100` (restarting each epoch), or
        `200/ 2983 batches` / `[10/25]` within epoch N; None when the line names none."""
        m = _STEP.search(line)
        if m is not None:
            n, per = int(m.group(1)), int(m.group(2)) if m.group(2) else None
        elif progress and ((p := _PROGRESS.search(line)) is not None or (p := _BRACKET.search(line)) is not None):
            n, per = int(p.group(1)), int(p.group(2))
        else:
            return None
        if per is None:
            return n
        if epoch is None:
            # `Iter(train) [100/40000]`, `Step 5/100` with no epoch: the count of the whole run
            if m is not None and 0 < n <= per:
                self.plan_total = self.plan_total or per
                if n == per:
                    self.facts.completed = self.facts.completed or f"reached its last step ({per:,})"
            return n
        e = epoch[0]
        if self.first_epoch is None:
            self.first_epoch = e
        self.steps_per_epoch, self.epoch_at = per, (e, n)
        # the counter restarts each epoch: epochs before this one, times the steps each holds
        return max(0, e - self.first_epoch) * per + n

    def _plan_line(self, line: str) -> None:
        """A printed setting that states the plan; the last printed wins (a relaunch may change it)."""
        for m in self.c.plan.finditer(line):
            kind = self.c.plan_kind.get(_norm(m.group(1)))
            digits = m.group(2).replace(",", "")
            if len(digits) > 12:  # `1,000,000,...` thousands of groups long: no plan, and int() refuses it
                continue
            value = int(digits)
            if value <= 0:
                continue
            if kind == "steps":
                self.plan_steps = value
            elif kind == "epochs":
                self.plan_epochs = value
            elif kind == "batch":
                self.batch_size = value

    def _steps_of_epochs(self, epochs: int, per: int, at: tuple[int, int]) -> str:
        total = epochs * per
        # the position in the whole plan: the epochs before this one (counted from 0 or 1), not only those in
        # the log (a resumed run's log opens at its 300th epoch; its own step count starts there)
        step = max(self.step, (at[0] - (0 if self.epoch_zero else 1)) * per + at[1])
        return (f"step {step:,} of {total:,} ({100 * step / total:.1f}%), step {at[1]:,} of {per:,} in "
                f"epoch {at[0]} of {epochs}")

    def finish(self) -> None:
        """At the end of the log: the run held against the plan it states (see the module docstring)."""
        facts = self.facts
        if self.resumed_after is not None and facts.completed is None and facts.traceback is None:
            # a relaunch from a checkpoint after a crash that never said it completed: the crash stays the
            # news of how the run went (the relaunch may have died unlogged, as the first launch did)
            facts.traceback = self.resumed_after
        if facts.launch_error is not None and self.after_launch_error >= LAUNCH_ERROR_TAIL:
            # argparse's error exits the process: a log that goes on for pages after it holds a later launch
            # (the command fixed and run again into the same file), and the refusal is not how it ended
            facts.launch_error = None
        if self.before_launch is not None and self.trained == self.steps_at_launch:
            # the last launch logged no training step (an inference or export script run after training)
            for name, value in self.before_launch.items():
                if name == "completed":
                    facts.completed = facts.completed or value
                elif name == "traceback":
                    facts.traceback = facts.traceback or value
                elif name in ("ends_with", "cut_off"):
                    setattr(facts, name, value)
                else:
                    setattr(self, name, value)
        if facts.completed is not None:
            return
        reached: list[str] = []
        short: list[str] = []
        epochs = self.epochs_of or self.plan_epochs
        at = self.epoch_at if self.first_epoch is not None and self.step > 0 else None
        per = self.steps_per_epoch if at is not None else None  # a step counter that restarts each epoch
        if epochs and self.epoch_max is not None:
            # epochs counted from 0 end at N - 1 (SwAV, DETR, `for epoch in range(N)`)
            done = self.epoch_max + (1 if self.epoch_zero else 0)
            if done >= epochs:
                reached.append(f"its last planned epoch ({done} of {epochs})")
            elif per and at is not None:  # `epoch 1 step 1300/8000`: the position in the run's steps
                short.append(self._steps_of_epochs(epochs, per, at))
            else:
                short.append(f"epoch {done} of {epochs} ({100 * done / epochs:.0f}%)")
        elif per and at is not None:
            if epochs and self.step < epochs * per - 1:
                short.append(self._steps_of_epochs(epochs, per, at))
            elif not epochs and at[1] < per:
                short.append(f"step {at[1]:,} of {per:,} in epoch {at[0]} (the log does not say how many epochs "
                             f"were planned)")
        total = self.plan_total or self.plan_steps
        last = self.relaunch if self.relaunch is not None else self.step
        bars_only = last == 0 and self.bar_seen > 0
        if bars_only:
            # bars without metrics (a bar is a position, but a data-loading bar is one too): where the run got
            # against a plan the log printed, never a completion
            last = self.bar_seen
        if total and last > 0 and not (bars_only and last >= total - 1):
            if last >= total - 1:  # steps counted from 0 end at N - 1 (detectron2, build-nanogpt)
                reached.append(f"its last planned step ({last:,} of {total:,})")
            else:
                short.append(f"step {last:,} of {total:,} ({100 * last / total:.1f}%)")
        final = self._final_evaluation()
        if reached or final:
            facts.completed = f"reached {reached[0]}" if reached else final
        elif short:
            # (a closing line short of the plan: the loop was left early, as timm's main() does on Ctrl-C)
            facts.cut_off = short[0]
        elif self.closing is not None:
            facts.completed = self.closing  # a closing summary no training step followed, and no plan against it
        elif facts.steps == 0 and self.epoch_max is None and (epochs or total):
            # a plan printed (a config dump, a start-up banner) and not one training step after it
            facts.cut_off = (f"its start: no training step of its {epochs:,} planned epochs" if epochs else
                             f"its start: no training step of its {total:,} planned steps")

    def _final_evaluation(self) -> str | None:
        """A last evaluation off the run's own evaluation cadence, at its last step: the evaluation a script
        runs once when it reaches its end (build-nanogpt's `last_step`, `trainer.evaluate()` after `train()`)."""
        ev = self.eval_steps[-32:]  # (the first evaluation may sit off the cadence: before step 0's line)
        if len(ev) < 4:
            return None
        gaps = [b - a for a, b in zip(ev[1:-1], ev[2:-1], strict=False)]
        every = gaps[0] if gaps else 0
        last = ev[-1] - ev[-2]
        if every <= 1 or any(g != every for g in gaps) or not 0 < last < every or self.step > ev[-1] + 1:
            return None
        return f"its final evaluation at step {ev[-1]}, off its every-{every}-steps cadence"

    def _traceback_line(self, line: str) -> None:
        assert self.tb is not None
        self.tb.append(line.rstrip())
        # Only an exception line ends the block: stdout and stderr share the log, so an unindented line
        # of ordinary output may land in the middle of a traceback.
        if _EXCEPTION_LINE.match(line) and len(self.tb) > 1:
            self.facts.traceback = self.tb
            self.tb = None
        elif len(self.tb) > TRACEBACK_LINES:
            self.tb = self.tb[:10] + self.tb[-TRACEBACK_LINES // 2:]


def _counts(m: re.Match[str]) -> bool:
    """Every number the match captured could be a count (a print of thousands of digits is damage, and int()
    refuses past 4,300 of them)."""
    return all(g is None or len(g) <= 18 for g in m.groups())
