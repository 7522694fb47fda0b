"""A training script's plain output (stdout/stderr as saved to a file), read line by line in constant memory.

What it understands, each line on its own:
- tqdm bars: `  3%|▎ | 30/1000 [00:05<02:40, 6.00it/s, loss=2.31, lr=1e-4]` (the bar's count is the step;
  a bar that restarts each epoch, as Lightning's does, keeps counting);
- Hugging Face dict lines: `{'loss': 2.31, 'grad_norm': 1.2, 'learning_rate': 5e-05, 'epoch': 0.1}`,
  eval dicts (`eval_loss`) and the closing `{'train_runtime': ...}`; JSON objects alike;
- `step 120 loss=2.31 lr=1e-4` / `Step 1000: loss=101.40, kd=21.14` lines (other `*loss` keys are
  loss parts) and `[Eval] loss: 22.3` lines;
- tracebacks, "Training complete" style lines, and PyTorch's own printed warnings;
- what each printed format's contract declares (`trainguard.ingest.formats`, one module per family): its
  completion lines, the settings that hold its plan (a config dump's `epochs: 400`, `--learning_steps 50000`),
  its sample counters (turned into steps), its lines that are not evaluations, its record lines
  (`250 val 5.26`), and the key/value tables of OpenAI's logger.

One step axis: a sample counter (`[640/60000 (1%)]`) becomes batches; a counter that restarts each epoch
becomes absolute. At the end the log is held against its plan: a run that reached its last planned epoch
or step finished; one that stopped short is "cut off at epoch 17 of 200 (8%)".

Lines are split on both `\\n` and `\\r` (tqdm redraws with `\\r`), decoded as UTF-8 or, failing that,
Latin-1 (a log whose encoding changed half way still reads), and cut at MAX_LINE bytes.

The reader is three modules: this one reads the file and turns each line's records into events
(`_LineParser`); `ingest.textlines` says what one line holds (the patterns, the formats' contracts, the
pure line helpers); `ingest.textstate` keeps where the run stands and judges its ending (`_ParserState`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trainguard.ingest.encoding import open_utf8
from trainguard.ingest.events import (
    LOSS_NAMES,
    Facts,
    Source,
    event,
    is_eval_name,
    metrics_to_events,
    sniff_binary,
    to_number,
)
from trainguard.ingest.textlines import (
    _BAR_EPOCH,
    _BLOCK_ROW,
    _CELL_METRIC,
    _CHECKPOINT,
    _EPOCH_BAR,
    _EPOCH_HEAD,
    _GLOG,
    _IMPROVED,
    _KV_ROW,
    _KV_RULE,
    _LR_PRINTED,
    _NOT_FINITE,
    _NOT_METRICS,
    _OF_MAX,
    _PLAN_HINTS,
    _PROGRESS,
    _PROMPT,
    _QUOTED,
    _QUOTED_TB,
    _RECORD,
    _SPACED,
    _STEP_ONLY,
    _STRAY,
    _SUMMARY,
    _TQDM,
    _UNKNOWN_BAR,
    _USAGE_ERROR,
    TORCH_WARNINGS,
    _bar_postfix,
    _epoch_of,
    _eval_key,
    _eval_line,
    _pairs,
    _part_names,
    _summary_loss,
    exact_count,
)
from trainguard.ingest.textstate import _ParserState

MAX_LINE = 64 * 1024  # bytes kept of one line; the rest of an enormous line is skipped
BLOCK = 1 << 20  # bytes read at a time

_NEWLINE = re.compile(rb"[\r\n]")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def read_text_log(path: Path) -> Source:
    """A Source over a log file; its events are read lazily, in one pass, in constant memory."""
    facts = Facts()
    with open_utf8(path) as f:  # (a PowerShell-written log is UTF-16: its text, re-encoded as UTF-8)
        head = f.read(8192)
        while head and not head.strip(b"\x00") and len(head) < 4 * BLOCK:
            # a log that starts with a hole of NUL bytes (truncated under its writer): its text comes after
            if not (more := f.read(BLOCK)):
                break
            head += more
        sniff_binary(head.lstrip(b"\x00")[:8192] or head[:8192], path)
    facts.mtime = path.stat().st_mtime
    plan = _peek_plan(path)
    return Source(path=path, format="text log", events=_events(path, facts), plan=plan, facts=facts,
                  log_like=True)


def _peek_plan(path: Path, limit: int = 4 * BLOCK) -> dict[str, Any]:
    """What the rules need first, from the first megabytes: the planned steps (`total_steps`), when a progress
    bar says it, and how much of its planned epochs went before the log's first step (`starts_at`, a share:
    a resumed run's log that opens at `Epoch: [300/484]` starts at 0.62 of its plan; its steps are counted
    from its first epoch, so only this says where in the plan they are)."""
    parser = _LineParser(Facts())
    with open_utf8(path) as f:
        head = f.read(limit)
    plan: dict[str, Any] = {}
    start: float | None = None
    for lineno, line in enumerate(iter_lines(_Bytes(head), Facts()), 1):
        parser.feed(lineno, line)
        if start is None and parser.step > 0:
            epochs = parser.epochs_of or parser.plan_epochs
            first = parser.first_epoch
            # (epochs counted from 0 or 1: a log that opens at epoch 0 or 1 starts at its plan's start)
            start = max(0, first - (0 if parser.epoch_zero else 1)) / epochs if first is not None and epochs else 0.0
            if start > 0:
                plan["starts_at"] = round(min(1.0, start), 4)
        if parser.plan_total:
            plan["total_steps"] = parser.plan_total
            if start is not None:
                break
    return plan


class _Bytes:
    def __init__(self, data: bytes) -> None:
        self.data = data

    def read(self, n: int) -> bytes:
        out, self.data = self.data[:n], self.data[n:]
        return out


def iter_lines(f: Any, facts: Facts) -> Iterator[str]:
    """Decoded lines of a binary stream, split on \\n and \\r, each cut at MAX_LINE bytes."""
    buf = b""
    dropping = False  # inside an enormous line whose head was already yielded
    while True:
        block = f.read(BLOCK)
        if not block:
            break
        facts.newlines += block.count(b"\n")
        if dropping:
            m = _NEWLINE.search(block)
            if m is None:
                continue
            block, dropping = block[m.end():], False
        buf += block
        pieces = _NEWLINE.split(buf)
        buf = pieces.pop()
        for piece in pieces:
            if piece:
                yield _decode(piece[:MAX_LINE])
        if len(buf) > MAX_LINE:
            facts.skipped += 1
            yield _decode(buf[:MAX_LINE])
            buf, dropping = b"", True
    if buf:
        yield _decode(buf[:MAX_LINE])


def _decode(raw: bytes) -> str:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        text = raw.decode("latin-1")  # never fails: a log whose encoding changed still reads
    if "\x1b" in text:
        text = _ANSI.sub("", text)
    if "\x00" in text:
        text = text.replace("\x00", "")  # a hole a truncated log left (see `sniff_binary`)
    return text

_TABLE_EPOCH = re.compile(r"(\d{1,9})/(\d{1,9})")  # a table's `epoch/last` field (`12/299`)


class _LineParser(_ParserState):
    """One pass over a log, a line at a time: each line's records, blocks and metrics as events (where the run
    stands and how it ended: `_ParserState`)."""

    def feed(self, lineno: int, line: str) -> list[dict[str, Any]]:
        """The events one line brings, a `launch` event (see `_returns`) before the line's own. A line whose
        numbers no count or value can be (thousands of digits: int() refuses past 4,300, a float overflows)
        is skipped as unreadable, like a truncated record: damage, not the run's data."""
        try:
            out = self._feed(lineno, line)
        except (ValueError, OverflowError):
            self.facts.skipped += 1
            out = []
        if self.queued:
            out, self.queued = self.queued + out, []
        return out

    def _feed(self, lineno: int, line: str) -> list[dict[str, Any]]:
        facts = self.facts
        stripped = line.strip()
        if not stripped:
            return []
        if self.block is not None:
            if (row := _BLOCK_ROW.match(line)) is not None:
                number = to_number(row.group(2).replace(",", ""))
                if number is not None and len(self.block[1]) < 256:
                    self.block[1][row.group(1).strip().lower()] = number
                self.block_rows += 1  # one record is one log call: its rows are no flood of output
                return []
            return self.close_block() + self._feed(lineno, line)
        self.lineno = lineno
        if facts.launch_error is not None:
            self.after_launch_error += 1  # argparse exits at its error: lines after it are another launch's
        facts.last_line = stripped[:500]
        if not _STRAY.match(stripped):
            facts.last_word = facts.last_line
        # (before the failure signatures: a quoted traceback's exception line is no failure of the run)
        if self.quoted is not None:
            if line.startswith(self.quoted):
                return []  # the rest of a traceback a logger quotes below ERROR level (`_QUOTED_TB`)
            self.quoted = None
        if self.tb is None and "Traceback (most recent call last)" in line and not line.startswith("Traceback") \
                and (q := _QUOTED_TB.match(line)) is not None:
            self.quoted = q.group("prefix")
            return []
        facts.signs.feed(lineno, line, facts.steps + facts.evals, facts.completed is not None)
        if line[:1] in "IW" and (g := _GLOG.match(line)) is not None:
            rest = line[g.end():]
            if self.tb is None and ("Traceback (most recent call last)" in rest or rest.startswith((" ", "\t"))):
                return []  # a traceback a logger quotes as a warning (torch._dynamo's recompile notes)
            line, stripped = rest, rest.strip()
            if not stripped:
                return []
        if "@" in line and ("$" in line or "#" in line):
            if _PROMPT.match(stripped):
                self._new_launch()
                return []
        if self.tb is not None:
            self._traceback_line(line)
        if "Traceback (most recent call last)" in line:
            self.tb = [line.strip()]
            return []
        if stripped.startswith("usage:"):
            self.usage = True
        elif self.usage and (m := _USAGE_ERROR.match(stripped)):
            # argparse refused the command line and exited 2: a run that failed at launch
            facts.launch_error = stripped[:300]
            self.after_launch_error = 0
            self.usage = False
        c = self.c
        low = stripped.lower()
        if c.completion is not None and (c.completion_hints is None or any(h in low for h in c.completion_hints)) \
                and c.completion.search(stripped):
            facts.completed = stripped[:200]
        if c.closing is not None and c.closing.search(stripped):
            self.closing = stripped[:200]
            return []  # a summary of the run (`*** Best metric: 61 (epoch 1)`): no step, evaluation or position
        # (an epoch's heading is a short line: _EPOCH_HEAD's `=+` runs are quadratic in a line of thousands of `=`)
        if "poch" in low and (ep := _epoch_of(line)) is not None and (ep[1] is not None or (
                len(line) < 500 and _EPOCH_HEAD.search(line))):
            self._epoch_seen(*ep)  # a position (`Epoch 3/500`, `=== Epoch 4 ===`), not a mention (`from epoch 66`)
        if c.columns and (self.table is not None or any(h in low for h in c.columns_hints)):
            rows = self._table_line(stripped, low)
            if rows is not None:
                return rows
        if c.launch is not None and c.launch.search(stripped):
            self._new_launch()
        if c.block_head is not None and "=" in stripped and (head := c.block_head.search(stripped)) is not None:
            self._open_block(head)
            return []
        if any(h in low for h in _PLAN_HINTS) and c.plan.search(line) is not None:
            self._plan_line(line)
        if stripped[-1] == "|" and (kv := _KV_ROW.search(stripped)) is not None:
            self.kv[kv.group(1).lower()] = float(kv.group(2))
            return []
        if self.kv and stripped[-1] == "-" and _KV_RULE.search(stripped):
            return self._kv_record()
        if c.records and stripped[-1].isdigit() and len(tail := stripped.rsplit(None, 3)) >= 3 \
                and tail[-2].lower() in c.records and tail[-3].isdigit() and (rec := _RECORD.search(stripped)):
            return self._record(rec)
        if "improved" in line or "not finite" in line:
            return self._early_stopping(line)
        if "heckpoint" in line and (m := _CHECKPOINT.search(line)):
            return [event("checkpoint", self.step, {"path": m.group(1).strip("'\"")}, name=m.group(1))]
        if "`" in line:
            for name, pattern in TORCH_WARNINGS:
                if pattern.search(line) and len(facts.warnings) < 20:
                    facts.warnings.append((lineno, name))
        if "=" not in line and ":" not in line and not _SPACED.search(line) \
                and not (line.count("|") >= 2 and _CELL_METRIC.search(line)):
            return []  # (cells of a metrics table, `eval step 500 | val_loss 0.05 |`, are read by `_pairs`)
        return self._metrics(stripped)

    # -- what a format's contract adds ------------------------------------------------------------

    def _table_line(self, stripped: str, low: str) -> list[dict[str, Any]] | None:
        """A declared table's header (it opens the table) or one of its rows, as events; None for any other line."""
        if any(h in low for h in self.c.columns_hints):
            for head, opened in self.c.columns:
                if head.search(stripped):
                    self.table = opened
                    return []
        cols = self.table
        if cols is None:
            return None
        fields = stripped.split(None, len(cols))
        if len(fields) < len(cols):
            return None
        values: dict[str, float] = {}
        evals: dict[str, float] = {}
        position: tuple[int, int] | None = None
        for meaning, text in zip(cols, fields, strict=False):
            text = text.rstrip(":")
            if meaning == "epoch/last":
                m = _TABLE_EPOCH.fullmatch(text)
                if m is None:
                    return None
                position = (int(m.group(1)), int(m.group(2)))
            elif meaning.startswith("="):
                if text.lower() != meaning[1:].lower():
                    return None
            elif meaning:
                number = to_number(text)
                if number is None:
                    return None  # a line that only starts like a row
                if meaning.startswith("eval:"):
                    evals[meaning[5:]] = number
                else:
                    values[meaning[5:] if meaning.startswith("part:") else meaning] = number
        if evals and not values:
            at = self.step
            return self._eval(at, evals)
        if position is None or not values:
            return None
        epoch, last = position
        self._epoch_seen(epoch, last + 1)  # `12/299`: epoch 12 of 0..299, 300 planned
        if self.first_epoch is None:
            self.first_epoch = epoch
        bar = _TQDM.search(fields[-1]) if len(fields) > len(cols) else None
        if bar is None:
            return []  # a row without its bar: no place within the epoch (its redraw with one follows)
        n, per = int(bar.group(1)), int(bar.group(2))
        if n == 0:
            return []
        self.steps_per_epoch, self.epoch_at = per, (epoch, n)
        return self._emit(max(0, epoch - self.first_epoch) * per + n, values, parts=True)

    def _open_block(self, head: re.Match[str]) -> None:
        """A declared record head (`[step=10/2500,epoch=0]`): the position and plan; its metrics follow."""
        found = {k: int(v) for k, v in head.groupdict().items() if v is not None}
        if "step" not in found:
            return
        if found.get("total"):
            self.plan_total = found["total"]
        if "epoch" in found:
            self._epoch_seen(found["epoch"], None)
        self.block = (found["step"], {})

    def close_block(self) -> list[dict[str, Any]]:
        """The open record's metrics as one step (and its evaluations), named by the declared `keys`."""
        if self.block is None:
            return []
        step, raw = self.block
        self.block = None
        metrics: dict[str, float] = {}
        for name, value in raw.items():
            meaning = next((keys[name] for when, keys in self.c.keys if when is None and name in keys), None)
            if meaning is None:
                metrics.setdefault(name, value)
            elif meaning.startswith("eval:"):
                metrics.setdefault(f"val_{meaning[5:]}", value)
            elif meaning not in ("step", "epoch", "batch"):
                metrics[meaning] = value
        if any(k in LOSS_NAMES for k in metrics):
            self._returns("", None, step)
        return self._emit(step, metrics, parts=False)

    def _kv_record(self) -> list[dict[str, Any]]:
        """A closed OpenAI-logger table: one record, at its `step` row (its `samples` row is a sample count)."""
        kv, self.kv = self.kv, {}
        step = kv.pop("step", None)
        kv.pop("samples", None)
        if step is None or not kv or not math.isfinite(step):
            return []  # a `| step | nan |` row is no step
        # `loss_q0..3` are the same loss per quartile of timesteps, not parts: no parts for a table
        return self._emit(int(step), kv, parts=False)

    def _record(self, rec: re.Match[str]) -> list[dict[str, Any]]:
        """`250 val 5.2649`: what the value is comes from the format's declared record names."""
        step, name, value = int(rec.group(1)), rec.group(2).lower(), float(rec.group(3))
        meaning = self.c.records.get(name)
        if meaning is None:
            return []
        if meaning.startswith("eval:"):
            return self._eval(step, {meaning[5:]: value})
        if self.facts.steps and step <= self.step:
            return []
        out = metrics_to_events(step, {meaning: value}, self.facts)
        if out:
            self.step = step
            self.facts.ends_with = "step"
        return out

    def _early_stopping(self, line: str) -> list[dict[str, Any]]:
        """Lightning's EarlyStopping prints only improvements, rounded to 3 decimals: each new best value of the
        monitored metric is an evaluation; the same printed value again is no new evaluation (not a frozen one)."""
        if (m := _IMPROVED.search(line)) is not None:
            name, value = m.group(1), float(m.group(2))
        elif (m := _NOT_FINITE.search(line)) is not None:
            name, value = m.group(1), float(m.group(2))
        else:
            return self._metrics(line.strip())
        if self.best.get(name) == value:
            return []
        self.best[name] = value
        return self._eval(self.step, {_eval_key(name) if is_eval_name(name) else name: value})

    def _eval(self, at: int, evals: dict[str, float]) -> list[dict[str, Any]]:
        self.last_eval = (at, evals)
        self.facts.evals += 1
        self.facts.fields.add("eval")
        self.facts.ends_with = "eval"
        if not self.eval_steps or self.eval_steps[-1] != at:
            self.eval_steps.append(at)
            if len(self.eval_steps) > 64:
                del self.eval_steps[8:-32]  # the cadence is read from the first and the last ones
        return [event("eval", at, evals)]

    def _metrics(self, line: str) -> list[dict[str, Any]]:
        if self.c.abbreviated is not None and ":" in line and (ab := self.c.abbreviated.search(line)) is not None:
            line = self._exact_step(line, ab)
        if line.startswith("{") and line.endswith("}"):
            return self._dict_line(line)
        if line.endswith("}") and (brace := line.find("{'")) > 0 and line.find("}") == len(line) - 1:
            # the Trainer's `logs` dict as the message of a logger (`... | INFO | ...:on_log:226 - {'loss': ...}`,
            # `logger.info(logs)`): the same record behind a prefix
            return self._dict_line(line[brace:])
        if "/?" in line and (glued := _UNKNOWN_BAR.match(line)) is not None:
            rest = line[glued.end():].strip()
            return self._metrics(rest) if rest else []  # the bar says nothing; the line after it is its own
        bar = _TQDM.search(line) if "/" in line and "[" in line else None
        if bar is not None and not _PROGRESS.search(line):
            drawn = self._bar_line(line, bar)
            # a line printed while a bar is drawn lands glued to it (`...45.0it/s][Eval] loss: 22.3`)
            rest = line[bar.end():].strip()
            return drawn + self._metrics(rest) if rest else drawn
        pairs = _pairs(line)
        if pairs and self.c.parts_after is not None and (after := self.c.parts_after.search(line)) is not None:
            losses = {k: v for k, v in _pairs(line[after.end():]).items() if k not in _NOT_METRICS}
            if losses:  # each value a loss of the model, the total their sum (the writer prints none)
                pairs = {k: v for k, v in pairs.items() if k not in losses}
                pairs.update({f"loss_{k}": v for k, v in losses.items()})
                pairs["loss"] = math.fsum(losses.values())
        if not pairs or len(pairs) == 1 and next(iter(pairs)) in ("step", "iter", "iteration", "global_step"):
            if (only := _STEP_ONLY.search(line)) is not None:
                self.pending = (self.lineno, int(only.group(1)))  # `iter = 43080`: its metrics are on the next line
            return []
        epoch = _epoch_of(line)
        keyed = self._keyed(line, pairs) if self.c.keys else {}
        if epoch is None and "epoch" in keyed:
            epoch = (keyed["epoch"], None)
        train = {k: v for k, v in pairs.items() if not is_eval_name(k) and k not in _NOT_METRICS
                 and not k.startswith(_SUMMARY)}
        evals = {_eval_key(k): v for k, v in pairs.items() if is_eval_name(k) and not _eval_key(k).startswith("best")
                 and _eval_key(k) not in _NOT_METRICS}  # (`eval step 500 | ...`: the step, no metric)
        # `[Eval] loss: 22.3`, `eval step 100 loss=2.1`: a line marked as evaluation is one as a whole, its
        # metrics under the log's own keys (`mean_dice`), the best so far left out
        if not evals and _eval_line(line):
            evals = {k: v for k, v in pairs.items() if k not in _NOT_METRICS and not k.startswith("best")}
            train = {}
        if evals and self.c.not_eval is not None and self.c.not_eval.search(line):
            evals = {}  # a setting (`EVAL_PERIOD: 200`) or an evaluation's own progress (`Sample: 3, ...`)
        if train and epoch and epoch[1] and epoch[0] == epoch[1] > 1:
            # `Epoch 100/100 - Train Loss: ...`: the last of the planned epochs was reached
            self.facts.completed = self.facts.completed or f"reached the last epoch: {line[:120]}"
        # a writer's own position key (declared `keys`) says more than a word the line happens to hold: the
        # CycleGAN template's `iters` is its counter within the epoch, not a step of the run
        step = None if "batch" in keyed and epoch is not None else self._position(line, epoch, bool(train))
        if step is None and "step" in keyed:
            step = keyed["step"]
        elif step is None and "batch" in keyed:
            # `ep: 0, batch: 20`: a counter within the epoch (absolute with the epochs before), a step without one
            step = self._epoch_iter(epoch[0], keyed["batch"], keyed.get("per")) if epoch is not None else keyed["batch"]
        if step is None and epoch is None and self.pending is not None and train \
                and self.pending[0] == self.lineno - 1:
            step = self.pending[1]  # the second line of a two-line record
        self.pending = None
        if train and (step is not None or epoch is not None) and not any(k in LOSS_NAMES for k in train):
            # a step line's own loss under another name: `[step 150] avg_loss=...` (the mean over the
            # step's samples), `[epoch: 16/200, iter: 325/489] total: 1.19`
            alias = train.pop("total", None)
            if alias is None:
                alias = next((pairs[k] for k in ("avg_loss", "mean_loss", "average_loss") if k in pairs), None)
            if alias is not None:
                train["loss"] = alias
        elif (not train and not evals and epoch is not None and step is None and (self.epoch_axis or not self.facts.steps)
              and (alias := _summary_loss(pairs)) is not None):
            # only epoch summaries in this log (`Epoch 3: Average Training Loss = 0.69`): they are its loss
            # curve, one row per epoch
            self.epoch_axis = True
            train, step = {"loss": alias}, epoch[0]
        if train and any(k in LOSS_NAMES for k in train):
            self._returns(line, epoch, step)
        if epoch is not None and (train or evals):
            self._epoch_seen(*epoch)
        out: list[dict[str, Any]] = []
        # `Epoch 1 - Batch loss: 12.1`: a line per batch with no step on it counts as the next step
        counting = epoch is not None or any(k.startswith("batch") for k in train)
        if train and (step is not None or counting):
            out = self._emit(step if step is not None else self.step + 1, train, parts=True)
            if out and train.get("lr") == 0 and (res := _LR_PRINTED.search(line)) is not None:
                # `lr:0.000000`: zero as printed, not as set: the rules allow for the print's resolution
                for row in out:
                    if row.get("kind") == "step":
                        row["extra"]["lr_resolution"] = 10.0 ** -len(res.group(1))
            if out and self.c.weighted is not None and self.c.weighted.search(line):
                for row in out:
                    if row.get("kind") == "step" and row.get("parts"):
                        row["extra"]["parts_weighted"] = True
        at = step if step is not None else self.step
        if evals and self.last_eval[0] == at and evals.items() <= self.last_eval[1].items():
            evals = {}  # the same numbers again (`saving best model (val_loss=1.36)` after the epoch's line)
        if evals:
            out += self._eval(at, evals)
        elif not out and pairs and any(k.startswith(_SUMMARY) for k in pairs):
            self.facts.ends_with = "summary"  # `Epoch 20 - Average Train Loss: 0.0038`: an epoch's end
        return out

    def _exact_step(self, line: str, ab: re.Match[str]) -> str:
        """The line with its big-number step (`step:1K`) written out: the step after the last plus the cadence
        the exact prints showed (`step:200`, `step:400`), as far as the rounding agrees."""
        printed = ab.group("count")
        n = exact_count(printed, self.abbr_last, self.abbr_every)
        if n is None:
            return line
        if self.abbr_last is not None and n <= self.abbr_last:
            self.abbr_every = None  # a count that went back: another launch, its cadence to learn again
        elif self.abbr_last is not None and printed[-1].isdigit():
            self.abbr_every = n - self.abbr_last
        self.abbr_last = n
        return line[:ab.start("count")] + str(n) + line[ab.end("count"):]

    def _keyed(self, line: str, pairs: dict[str, float]) -> dict[str, int]:
        """A writer's own short names (declared `keys`): positions taken out of `pairs` (returned), metrics
        renamed in it to what they are (`trl` -> `loss`, `tel` -> `val_loss`)."""
        out: dict[str, int] = {}
        for when, keys in self.c.keys:
            if when is not None and when.search(line) is None:
                continue
            for name in [k for k in pairs if k in keys]:
                meaning, value = keys[name], pairs.pop(name)
                if meaning in ("step", "epoch", "batch"):
                    if math.isfinite(value) and 0 <= value < 1e15 and value == int(value):  # (inf, nan: no position)
                        out.setdefault(meaning, int(value))
                        if meaning == "batch" and (per := re.search(rf"\b{re.escape(name)}\s*[:=]\s*\d+\s*/\s*(\d{{1,12}})",
                                                                    line, re.IGNORECASE)) is not None:
                            out["per"] = int(per.group(1))
                elif meaning.startswith("eval:"):
                    pairs.setdefault(f"val_{meaning[5:]}", value)
                else:
                    pairs.setdefault(meaning, value)
        return out

    def _dict_line(self, line: str) -> list[dict[str, Any]]:
        pairs = {k: v for k, v in ((k, to_number(v)) for k, v in _QUOTED.findall(line)) if v is not None}
        if not pairs:
            return []
        if "train_runtime" in pairs:
            return []  # the closing summary (its mean loss is no step)
        step = pairs.pop("step", None) or pairs.pop("global_step", None)
        if step is None and (swift := _OF_MAX.search(line)) is not None:
            # ms-swift: 'global_step/max_steps': '10/500'
            step, total = int(swift.group(1)), int(swift.group(2))
            self.plan_total = self.plan_total or total
            if step == total:
                self.facts.completed = self.facts.completed or f"global_step reaches max_steps ({total:,})"
        if all(k.startswith("eval_") for k in pairs if k != "epoch"):
            data = {k[5:]: v for k, v in pairs.items() if k.startswith("eval_")}
            return self._eval(int(step) if step is not None else self.step, data)
        if step is None:
            # Hugging Face prints no step: the progress bar drawn just before says where it is; a step
            # another line already reported keeps that line's numbers; without a bar, lines are counted
            if self.bar_total:
                step = self.bar_offset + self.bar_last
                if step <= self.step:
                    return []
            else:
                step = self.step + 1
        return self._emit(int(step), {k: v for k, v in pairs.items() if k != "epoch"}, parts=False)

    def _bar_line(self, line: str, bar: re.Match[str]) -> list[dict[str, Any]]:
        n, total = int(bar.group(1)), int(bar.group(2))
        if _EPOCH_BAR.match(line) and line.lower().lstrip().startswith(("validation", "sanity")):
            return []  # Lightning's validation bar counts eval batches, not steps
        if (named := _BAR_EPOCH.match(line)) is not None:
            # Lightning's `Epoch 14: 100%|...| 352/352`: the epoch its description names places the bar, also
            # where a saved output kept only each epoch's last redraw (the count never goes back)
            epoch = int(named.group(1))
            if self.bar_epoch_first is None:
                self.bar_epoch_first = epoch
            self.bar_offset = max(0, epoch - self.bar_epoch_first) * total
        elif n < self.bar_last and total == self.bar_total:
            self.bar_offset += self.bar_total  # a bar that restarts each epoch
        self.bar_last, self.bar_total = n, total
        post = _bar_postfix(line)
        if not _EPOCH_BAR.match(line):  # where the run is, with or without metrics on its bar
            self.bar_seen = max(self.bar_seen, self.bar_offset + n)
        if post is None or n == 0:
            return []
        # Lightning's bar prints a NaN as `nan.0`
        pairs = {k: v for k, v in ((k, to_number(v[:-2] if v.lower().endswith(("nan.0", "inf.0")) else v))
                                   for k, v in re.findall(r"([\w/.\-]+)=([^,\s\]]+)", post)) if v is not None}
        if self.plan_total is None and not _EPOCH_BAR.match(line):
            self.plan_total = total
        return self._emit(self.bar_offset + n, pairs, parts=True)

    def _emit(self, step: int, pairs: dict[str, float], *, parts: bool) -> list[dict[str, Any]]:
        if any(k in LOSS_NAMES for k in pairs):
            self.trained += 1
        if (self.facts.traceback is not None or self.facts.completed is not None) and self.tb is None \
                and 0 <= step < self.step and any("loss" in k for k in pairs):
            # a training row back before the step the log had reached, after a traceback or an ending line:
            # the script relaunched from a checkpoint (`Resuming from checkpoint_1225000.pt`), another launch
            # whose ending neither is (once it says it completed: see `finish`); the process that raised
            # the traceback prints no row after it, and detectron2 prints `Total training time` on a crash too
            self.resumed_after = self.facts.traceback or self.resumed_after
            self._new_launch()
        if step <= self.step or not pairs:
            if 0 <= step <= 1 < self.step // 100 and any(k in LOSS_NAMES for k in pairs):
                # a fresh launch appended to the log (its steps start again from the beginning): the earlier
                # launch's completion line is not this one's ending (its steps are read once past the old)
                self.facts.completed = None
                self.relaunch = step
            elif self.relaunch is not None and any(k in LOSS_NAMES for k in pairs):
                self.relaunch = max(self.relaunch, step)
            return []  # a bar redrawn at the same count, or a line that says nothing new
        prefixes = _part_names(tuple(pairs)) if parts else ()
        out = metrics_to_events(step, pairs, self.facts, parts_from=prefixes)
        if out:
            self.step = step
            self.relaunch = None  # a relaunch that got past the earlier launch's steps is read as it goes
            self.facts.ends_with = "step"
            self.closing = None
        return out


def _events(path: Path, facts: Facts) -> Iterator[dict[str, Any]]:
    parser = _LineParser(facts)
    # the lines printed per step, as the watchdog counts them live (for `log-flood`): one count at the
    # start, one at the end
    yield event("output", 0, {"lines": 0})
    with open_utf8(path) as f:
        for lineno, line in enumerate(iter_lines(f, facts), 1):
            facts.lines = lineno
            yield from parser.feed(lineno, line)
    closed = parser.close_block()
    yield from parser.queued + closed
    parser.finish()
    if parser.step:
        # newline-ended lines only: a tqdm bar's carriage-return redraws scroll nothing
        yield event("output", parser.step, {"lines": max(0, facts.newlines - parser.block_rows)})
    if parser.tb is not None and len(parser.tb) > 1:
        facts.traceback = parser.tb  # a traceback cut off by the end of the file
