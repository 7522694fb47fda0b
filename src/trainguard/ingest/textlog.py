"""A training script's plain output (stdout/stderr as saved to a file), read line by line in constant memory.

What it understands, each line on its own:
- tqdm bars: `  3%|▎ | 30/1000 [00:05<02:40, 6.00it/s, loss=2.31, lr=1e-4]` (the bar's count is the step;
  a bar that restarts each epoch, as Lightning's does, keeps counting);
- Hugging Face dict lines: `{'loss': 2.31, 'grad_norm': 1.2, 'learning_rate': 5e-05, 'epoch': 0.1}`,
  eval dicts (`eval_loss`) and the closing `{'train_runtime': ...}`; JSON objects alike;
- `step 120 loss=2.31 lr=1e-4` / `Step 1000: loss=101.40, kd=21.14` lines (other `*loss` keys are
  loss parts) and `[Eval] loss: 22.3` lines;
- tracebacks, "Training complete" style lines, and PyTorch's own printed warnings.

Lines are split on both `\\n` and `\\r` (tqdm redraws with `\\r`), decoded as UTF-8 or, failing that,
Latin-1 (a log whose encoding changed half way still reads), and cut at MAX_LINE bytes.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trainguard.ingest.events import (
    Facts,
    Source,
    event,
    is_eval_name,
    metrics_to_events,
    sniff_binary,
    to_number,
)
from trainguard.ingest.signs import SCHEDULER_BEFORE_OPTIMIZER

MAX_LINE = 64 * 1024  # bytes kept of one line; the rest of an enormous line is skipped
BLOCK = 1 << 20  # bytes read at a time
TRACEBACK_LINES = 400  # lines kept of one traceback

_NEWLINE = re.compile(rb"[\r\n]")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_NUM = r"[-+]?(?:nan|inf(?:inity)?|\d+(?:\.\d*)?(?:e[-+]?\d+)?|\.\d+(?:e[-+]?\d+)?)"
# `loss=2.3`, `Loss: 2.3`, and with the words that qualify a name in front: `Train Loss: 1.12`,
# `Batch loss: 12.1`, `Val Loss: 1.36` (only these words, so `INFO root loss: 2` stays `loss`)
_QUALIFIER = r"(?:(?:train|training|val|valid|validation|eval|evaluation|test|dev|batch|average|avg|mean|epoch|total|running)\s+){0,2}"
# a key starts where a word starts: without the look-behind a 64 KiB run of letters (a base64 blob) is
# tried from each of its positions, quadratic in the line (minutes for one line)
_PAIR = re.compile(r"(?<![\w/.\-])(" + _QUALIFIER + r"[A-Za-z][\w/.\-]*)\s*[=:]\s*(" + _NUM + r")(?![\w.])",
                   re.IGNORECASE)
_SPACED = re.compile(r"\b(" + _QUALIFIER + r"(?:loss|lr|learning_rate|grad_norm))\s+(" + _NUM + r")(?![\w.])",
                     re.IGNORECASE)
# one cell of a `| lr 20.0000 | loss   nan |` table (pytorch/examples, fairseq): a name, then its number
_CELL = re.compile(r"((?:[A-Za-z][\w/.\-]*\s+){0,3}?[A-Za-z][\w/.\-]*)\s*[:=]?\s*(" + _NUM + r")", re.IGNORECASE)
# a table's cell named as a metric (`| val_loss 0.05 |`): a line of cells with none is no metrics line
# (`| test 5 | passed 12 |`, `cmd | tee log | head -5`)
_CELL_METRIC = re.compile(r"(?:^|[\s|_/])(?:loss|ppl|perplexity|acc|accuracy|lr|grad_norm|bleu|rouge\w*|f1|wer|cer|"
                          r"exact\w*|em)\s+" + _NUM, re.IGNORECASE)
# `BLEU-1 73.98, BLEU-2 68.28` on a line that says it is an evaluation
_LOOSE = re.compile(r"(?<![\w/.\-])([A-Za-z][\w\-]*)\s+(" + _NUM + r")(?![\w.])", re.IGNORECASE)
# Hugging Face 5 prints its values quoted ('loss': '1.181'), older versions bare ('loss': 1.181)
_QUOTED = re.compile(r"""['"]([\w/.\-]+)['"]\s*:\s*['"]?(""" + _NUM + r""")['"]?(?![\w.])""", re.IGNORECASE)
# `step 120`, `Step 5/100`, `global_step: 10` (PaddleOCR), `num_updates=100` (fairseq), `Iter(train) [100/40000]`
_STEP = re.compile(r"\b(?:global[_ ]step|num_updates|step|iter(?:ation)?)\b(?:\(\w+\))?\s*[:=#]?\s*\[?\s*(\d{1,15})"
                   r"(?:\s*/\s*(\d{1,15}))?", re.IGNORECASE)
# `Epoch 3/100`, `epoch 001`, `Epoch: [0]` (torchvision), `Epoch(train) [1]` (mmengine), `epoch: [1/500]`
# (PaddleOCR), `Train: 0 [` (timm)
_EPOCH = re.compile(r"\bepoch\b(?:\(\w+\))?\s*[:=#]?\s*\[?\s*(\d{1,15})(?:\s*/\s*(\d{1,15}))?|\btrain:\s*(\d{1,15})\s+(?=\[)",
                    re.IGNORECASE)
# `[10/25]`, `[   0/1251 (  0%)]`: where in its epoch a bracketed progress line is
_BRACKET = re.compile(r"\[\s*(\d{1,15})\s*/\s*(\d{1,15})\s*(?:\(\s*\d+%\s*\))?\s*\]")
_OF_MAX = re.compile(r"""global_step/max_steps['"]?\s*:\s*['"]?(\d{1,15})/(\d{1,15})""")
# `200/ 2983 batches`: where in the epoch a pytorch/examples-style line is
_PROGRESS = re.compile(r"(?<!\d)(\d{1,15})\s*/\s*(\d{1,15})\s*(?:batches|batch|steps|iters|iterations)\b", re.IGNORECASE)
_NOT_METRICS = {"step", "global_step", "iter", "iteration", "it", "epoch", "time", "eta", "num_updates"}
_SUMMARY = ("average_", "avg_", "mean_", "epoch_", "best_")  # an epoch's summary, not a step's value
_TQDM = re.compile(r"(\d+)/(\d+) \[[^\]]{0,1000}?\]")
# a bar with its bracket; the postfix (`loss=2.1, lr=1e-4`) is cut out of the bracket in Python: as one
# regex (lazy prefix, comma, `=` inside) it was cubic in a bracket that never closes
_TQDM_BRACKET = re.compile(r"(\d+)/(\d+) \[([^\]]{0,1000})\]")  # a bracket is short: bounded scan
_EVAL_WORD = re.compile(r"(?:^|[\s\[(|])(?:eval|evaluation|val|valid|validation|dev|test)\b", re.IGNORECASE)
# `train_bash.py: error: argument --fp16: ...` after argparse's `usage:` block: the run never started
_USAGE_ERROR = re.compile(r"^([\w.\-]+): error: (.+)$")
_EPOCH_BAR = re.compile(r"^\s*(?:epoch|validation|sanity)", re.IGNORECASE)
# the last line of a traceback, as `trainguard.rules.crash` reads it
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit|Warning|Fault|[A-Z]\w*)(?::|$)")
_CHECKPOINT = re.compile(r"(?:saving|saved) (?:model )?checkpoint (?:to |at |in )?(\S+)", re.IGNORECASE)
COMPLETION = re.compile(
    r"training (?:is )?(?:complete|completed|finished|done)|finished training|done training|"
    r"train(?:ing)? complete|['\"]train_runtime['\"]|`Trainer\.fit` stopped|all done\b|\brun (?:complete|finished)\b|"
    r"end of training|\bdone\b[:,]?\s+\d+\s+(?:steps|iterations|iters|epochs)\b|\*+ train metrics \*+|"
    r"\d+ epochs completed in|done training in",
    re.IGNORECASE,
)

# PyTorch's own warnings that name a training bug: (name, pattern). `diagnose` makes findings of them.
TORCH_WARNINGS: list[tuple[str, re.Pattern[str]]] = [
    (SCHEDULER_BEFORE_OPTIMIZER.name,
     re.compile(r"Detected call of `lr_scheduler\.step\(\)` before `optimizer\.step\(\)`")),
]


def read_text_log(path: Path) -> Source:
    """A Source over a log file; its events are read lazily, in one pass, in constant memory."""
    facts = Facts()
    with open(path, "rb") as f:
        sniff_binary(f.read(8192), path)
    facts.mtime = path.stat().st_mtime
    plan = {"total_steps": total} if (total := _peek_total(path)) else {}
    return Source(path=path, format="text log", events=_events(path, facts), plan=plan, facts=facts,
                  log_like=True)


def _peek_total(path: Path, limit: int = 4 * BLOCK) -> int | None:
    """The planned steps, when a progress bar in the first megabytes says it (the rules need it first)."""
    parser = _LineParser(Facts())
    with open(path, "rb") as f:
        head = f.read(limit)
    for lineno, line in enumerate(iter_lines(_Bytes(head), Facts()), 1):
        parser.feed(lineno, line)
        if parser.plan_total:
            return parser.plan_total
    return None


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
    return text


class _LineParser:
    """The state of one pass over a log: the step count, tqdm's epoch offset, the open traceback."""

    def __init__(self, facts: Facts) -> None:
        self.facts = facts
        self.step = 0  # the last step emitted
        self.bar_offset = 0
        self.bar_last = 0
        self.bar_total = 0
        self.plan_total: int | None = None
        self.tb: list[str] | None = None
        self.first_epoch: int | None = None  # the first epoch number seen: a per-epoch counter counts from it
        self.usage = False  # inside argparse's `usage:` block
        self.last_eval: tuple[int | None, dict[str, float]] = (None, {})

    def feed(self, lineno: int, line: str) -> list[dict[str, Any]]:
        facts = self.facts
        stripped = line.strip()
        if not stripped:
            return []
        facts.last_line = stripped[:500]
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
            self.usage = False
        # cheap substring tests first: most lines are metrics, and a regex per line costs on a 1 GB log
        if ("omplete" in line or "inish" in line or "one" in line or "runtime" in line or "stopped" in line
                or "nd of t" in line or " metrics " in line) \
                and COMPLETION.search(line):
            facts.completed = stripped[:200]
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

    def _metrics(self, line: str) -> list[dict[str, Any]]:
        if line.startswith("{") and line.endswith("}"):
            return self._dict_line(line)
        bar = _TQDM.search(line) if "/" in line and "[" in line else None
        if bar is not None and not _PROGRESS.search(line):
            drawn = self._bar_line(line, bar)
            # a line printed while a bar is drawn lands glued to it (`...45.0it/s][Eval] loss: 22.3`)
            rest = line[bar.end():].strip()
            return drawn + self._metrics(rest) if rest else drawn
        pairs = _pairs(line)
        if not pairs:
            return []
        epoch = _epoch_of(line)
        train = {k: v for k, v in pairs.items() if not is_eval_name(k) and k not in _NOT_METRICS
                 and not k.startswith(_SUMMARY)}
        evals = {_eval_key(k): v for k, v in pairs.items() if is_eval_name(k) and not _eval_key(k).startswith("best")
                 and _eval_key(k) not in _NOT_METRICS}  # (`eval step 500 | ...`: the step, no metric)
        # `[Eval] loss: 22.3`, `eval step 100 loss=2.1`: a line marked as evaluation is one as a whole
        if not evals and _eval_line(line):
            evals, train = train, {}
        if train and epoch and epoch[1] and epoch[0] == epoch[1] > 1:
            # `Epoch 100/100 - Train Loss: ...`: the last of the planned epochs was reached
            self.facts.completed = self.facts.completed or f"reached the last epoch: {line[:120]}"
        # an evaluation's own progress (`Epoch(val) [1][5/5]`) counts evaluation batches, not steps
        step = self._step_of(line, epoch if train else None, progress=bool(train))
        out: list[dict[str, Any]] = []
        # `Epoch 1 - Batch loss: 12.1`: a line per batch with no step on it counts as the next step
        counting = epoch is not None or any(k.startswith("batch") for k in train)
        if train and (step is not None or counting):
            out = self._emit(step if step is not None else self.step + 1, train, parts=True)
        at = step if step is not None else self.step
        if evals and self.last_eval[0] == at and evals.items() <= self.last_eval[1].items():
            evals = {}  # the same numbers again (`saving best model (val_loss=1.36)` after the epoch's line)
        if evals:
            self.last_eval = (at, evals)
            self.facts.evals += 1
            self.facts.fields.add("eval")
            self.facts.ends_with = "eval"
            out.append(event("eval", at, evals))
        elif not out and pairs and any(k.startswith(_SUMMARY) for k in pairs):
            self.facts.ends_with = "summary"  # `Epoch 20 - Average Train Loss: 0.0038`: an epoch's end
        return out

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
        # the counter restarts each epoch: epochs before this one, times the steps each holds
        return max(0, e - self.first_epoch) * per + n

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
            self.facts.evals += 1
            self.facts.fields.add("eval")
            return [event("eval", int(step) if step is not None else self.step, data)]
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
        if n < self.bar_last and total == self.bar_total:
            self.bar_offset += self.bar_total  # a bar that restarts each epoch
        self.bar_last, self.bar_total = n, total
        post = _bar_postfix(line)
        if post is None or n == 0:
            return []
        pairs = {k: v for k, v in ((k, to_number(v)) for k, v in re.findall(r"([\w/.\-]+)=([^,\s\]]+)",
                                                                            post)) if v is not None}
        if self.plan_total is None and not _EPOCH_BAR.match(line):
            self.plan_total = total
        return self._emit(self.bar_offset + n, pairs, parts=True)

    def _emit(self, step: int, pairs: dict[str, float], *, parts: bool) -> list[dict[str, Any]]:
        if step <= self.step or not pairs:
            return []  # a bar redrawn at the same count, or a line that says nothing new
        prefixes = _part_names(tuple(pairs)) if parts else ()
        out = metrics_to_events(step, pairs, self.facts, parts_from=prefixes)
        if out:
            self.step = step
            self.facts.ends_with = "step"
        return out


def _epoch_of(line: str) -> tuple[int, int | None] | None:
    """(epoch, planned epochs or None) when the line names its epoch."""
    if "poch" not in line and "rain:" not in line:
        return None
    m = _EPOCH.search(line)
    if m is None:
        return None
    if m.group(3) is not None:
        return int(m.group(3)), None
    return int(m.group(1)), int(m.group(2)) if m.group(2) else None


def _pairs(line: str) -> dict[str, float]:
    """A line's named numbers, names lower-cased with their qualifying words joined (`train_loss`)."""
    out = {_key(k): float(v) for k, v in _PAIR.findall(line)}  # _NUM only matches what float() reads
    if line.count("|") >= 2:  # `| lr 20.0000 | loss   nan |`: each cell a name and its number
        for cell in line.split("|"):
            if (m := _CELL.fullmatch(cell.strip())) is not None:
                out.setdefault(_key(m.group(1)), float(m.group(2)))
    if not out:
        out = {_key(k): float(v) for k, v in _SPACED.findall(line)}
    if not out and _eval_line(line):
        out = {_key(k): float(v) for k, v in _LOOSE.findall(line)}
    return {k: v for k, v in out.items() if not k.endswith("epoch") or k == "epoch"}


def _eval_line(line: str) -> bool:
    """A line that says it is an evaluation (`[Eval]`, `Validation BLEU`, `Dev BLEU`, `| valid loss |`)."""
    low = line.lower()
    # every word looked for holds one of these: the substring test costs a tenth of the search
    return ("val" in low or "dev" in low or "test" in low) and _EVAL_WORD.search(line) is not None


@functools.lru_cache(maxsize=1024)
def _key(name: str) -> str:
    key = "_".join(name.lower().split())
    return "loss" if key in ("batch_loss", "step_loss", "iter_loss", "train_batch_loss") else key


@functools.lru_cache(maxsize=1024)
def _eval_key(name: str) -> str:
    """`val_loss` -> `loss`, `valid_ppl` -> `ppl`: an evaluation's metric under its own name. A key whose
    rest names the data, not a metric (`validation set: 10.3 %`, `test images: 96 %`), keeps the log's
    own words: the metric is the line's, and "set" is no metric's name."""
    for sep in ("/", "_"):
        if sep in name:
            rest = name.split(sep, 1)[1]
            return name if not rest or rest in _DATA_NOUNS else rest
    return name


# what follows "validation"/"test" in a key that names the data evaluated, not what was measured on it
_DATA_NOUNS = frozenset({"set", "sets", "data", "dataset", "split", "subset", "images", "samples", "examples",
                         "batches", "batch"})


@functools.lru_cache(maxsize=1024)
def _bar_postfix(line: str) -> str | None:
    """`loss=2.1, lr=1e-4` of the first bar whose bracket has, after its first comma, a `key=value`."""
    for m in _TQDM_BRACKET.finditer(line):
        inside = m.group(3)
        comma = inside.find(",")
        if comma >= 0 and "=" in inside[comma + 1:]:
            return inside[comma + 1:].lstrip()
    return None


def _part_names(keys: tuple[str, ...]) -> tuple[str, ...]:
    """Keys that are loss parts (`kd_loss`, `lm_loss`): named *loss but not the total."""
    return tuple(k for k in keys if (k.lower().endswith("loss") or k.lower().startswith("loss_")) and k.lower() not in
                 ("loss", "train_loss", "total_loss", "tr_loss", "training_loss"))


def _events(path: Path, facts: Facts) -> Iterator[dict[str, Any]]:
    parser = _LineParser(facts)
    # the lines printed per step, as the watchdog counts them live (for `log-flood`): one count at the
    # start, one at the end
    yield event("output", 0, {"lines": 0})
    with open(path, "rb") as f:
        for lineno, line in enumerate(iter_lines(f, facts), 1):
            facts.lines = lineno
            yield from parser.feed(lineno, line)
    if parser.step:
        # newline-ended lines only: a tqdm bar's carriage-return redraws scroll nothing
        yield event("output", parser.step, {"lines": facts.newlines})
    if parser.tb is not None and len(parser.tb) > 1:
        facts.traceback = parser.tb  # a traceback cut off by the end of the file
