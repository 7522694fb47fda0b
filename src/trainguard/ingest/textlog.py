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
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trainguard.ingest.events import (
    LOSS_NAMES,
    Facts,
    Source,
    event,
    is_eval_name,
    launch_event,
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
_END = r"(?!\w|\.\d)"  # where a number ends: `Loss: 0.2154.` ends a sentence, `1.2.3` is no number
_PAIR = re.compile(r"(?<![\w/.\-])(" + _QUALIFIER + r"[A-Za-z][\w/.\-]*)\s*[=:]\s*(" + _NUM + r")" + _END,
                   re.IGNORECASE)
_SPACED = re.compile(r"\b(" + _QUALIFIER + r"(?:loss|lr|learning_rate|grad_norm|norm))\s+(" + _NUM + r")" + _END,
                     re.IGNORECASE)
# one cell of a `| lr 20.0000 | loss   nan |` table (pytorch/examples, fairseq): a name, then its number
_CELL = re.compile(r"((?:[A-Za-z][\w/.\-]*\s+){0,3}?[A-Za-z][\w/.\-]*)\s*[:=]?\s*(" + _NUM + r")", re.IGNORECASE)
# a table's cell named as a metric (`| val_loss 0.05 |`): a line of cells with none is no metrics line
# (`| test 5 | passed 12 |`, `cmd | tee log | head -5`)
_CELL_METRIC = re.compile(r"(?:^|[\s|_/])(?:loss|ppl|perplexity|acc|accuracy|lr|grad_norm|bleu|rouge\w*|f1|wer|cer|"
                          r"exact\w*|em)\s+" + _NUM, re.IGNORECASE)
# `BLEU-1 73.98, BLEU-2 68.28` on a line that says it is an evaluation
_LOOSE = re.compile(r"(?<![\w/.\-])([A-Za-z][\w\-]*)\s+(" + _NUM + r")" + _END, re.IGNORECASE)
# Hugging Face 5 prints its values quoted ('loss': '1.181'), older versions bare ('loss': 1.181)
_QUOTED = re.compile(r"""['"]([\w/.\-]+)['"]\s*:\s*['"]?(""" + _NUM + r""")['"]?(?![\w.])""", re.IGNORECASE)
# `step 120`, `Step 5/100`, `global_step: 10` (PaddleOCR), `num_updates=100` (fairseq), `Iter(train) [100/40000]`
_STEP = re.compile(r"\b(?:global[_ ]step|num_updates|step|iter(?:ation)?s?)\b(?:\(\w+\))?\s*[:=#]?\s*\[?\s*(\d{1,15})"
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
_NOT_METRICS = {"step", "global_step", "iter", "iters", "iteration", "iterations", "it", "epoch", "time", "eta",
                "num_updates", "sample", "samples", "batch", "consumed_samples"}
_COUNTS = {"sample", "samples", "images", "examples", "batches", "size", "tokens"}
_SUMMARY = ("average_", "avg_", "mean_", "epoch_", "best_")  # an epoch's summary, not a step's value
# counts of at most 12 digits, begun where a number begins: `(\d+)/` tried at every digit of a run of thousands
# (a hostile or damaged log) was quadratic, 0.6 s a line of 5,000 digits
_TQDM = re.compile(r"(?<!\d)(\d{1,12})/(\d{1,12}) \[[^\]]{0,1000}?\]")
# a bar with its bracket; the postfix (`loss=2.1, lr=1e-4`) is cut out of the bracket in Python: as one
# regex (lazy prefix, comma, `=` inside) it was cubic in a bracket that never closes
_TQDM_BRACKET = re.compile(r"(?<!\d)(\d{1,12})/(\d{1,12}) \[([^\]]{0,1000})\]")  # a bracket is short: bounded scan
_EVAL_WORD = re.compile(r"(?:^|[\s\[(|])(?:eval|evaluation|evaluating|val|valid|validation|validating|dev|test|testing)\b",
                        re.IGNORECASE)
# `train_bash.py: error: argument --fp16: ...` after argparse's `usage:` block: the run never started
_USAGE_ERROR = re.compile(r"^([\w.\-]+): error: (.+)$")
_EPOCH_BAR = re.compile(r"^\s*(?:epoch|validation|sanity)", re.IGNORECASE)
# the last line of a traceback, as `trainguard.rules.crash` reads it
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit|Warning|Fault|[A-Z]\w*)(?::|$)")
_CHECKPOINT = re.compile(r"(?:saving|saved) (?:model )?checkpoint (?:to |at |in )?(\S+)", re.IGNORECASE)
# a line that is an epoch's header: `Epoch 3`, `=== Epoch 4 ===`, `INFO:root:Epoch 5`, `Starting epoch 399 ...`
_EPOCH_HEAD = re.compile(r"(?:^|[:\-=|>\]]\s*)(?:=+\s*)?(?:starting |end of )?epoch\s*[:#]?\s*\[?\d+\]?\s*(?:\.\.\.)?\s*[=:]*\s*$",
                         re.IGNORECASE)
# `[19,  2125/ 2562]` (I-JEPA under logging): [epoch, iteration within it (/ per epoch)], at a line's start
_EPOCH_ITER = re.compile(r"(?:^|:)\s*\[\s*(\d{1,9}),\s*(\d{1,12})(?:\s*/\s*(\d{1,12}))?\s*\]")
# one row of OpenAI's logger table (`| loss      | 0.533    |`), and the dashed line that closes the table
_KV_ROW = re.compile(r"(?:^|\s)\|\s*([A-Za-z][\w/.\-]*)\s*\|\s*(" + _NUM + r")\s*\|$", re.IGNORECASE)
_KV_RULE = re.compile(r"(?:^|\s)-{8,}$")
# `250 val 5.2649` (build-nanogpt's log.txt): a record of one value
_RECORD = re.compile(r"(?:^|\s)(\d{1,12})\s+([A-Za-z][\w\-]*)\s+(" + _NUM + r")$", re.IGNORECASE)
# Lightning's EarlyStopping: an improvement of the monitored metric, printed with its new best value
_IMPROVED = re.compile(r"\bMetric (\S+) improved(?: by [^.]*\.\d+ >= min_delta = [^.]*(?:\.\d+)?)?\. New best score: "
                       r"(" + _NUM + r")")
_NOT_FINITE = re.compile(r"\bMonitored metric (\S+) = (nan|inf|-inf) is not finite")
_FRACTION = re.compile(r"\s*/\s*(\d{1,15})(?![\d.])")
# `Accuracy on validation set: 10.3`, `Accuracy of the network on the validation set: 15.8 %` (PyTorch's
# CIFAR-10 tutorial): the metric's own name is the phrase's first word, before the split it was measured on
_ON_SET = re.compile(r"(?:^|[\s,;|\]])([A-Za-z][\w\-]*)\s+(?:on|of|for)\s+[^:=]*?\b(?:set|split)\s*[:=]",
                     re.IGNORECASE)
# a line that is only a step (`iter = 43080`, `current step: 58036th step`): the record's metrics follow on the
# very next line (`\tloss = 0.42, accuracy = 0.83`; `batch loss:0.0047`). Its separator is required: a summary
# table's `wandb:   iter 3000` row is no record's step
_STEP_ONLY = re.compile(r"(?:^|[\s\]|:>\-])(?:current\s+|global[_ ])?(?:step|iter(?:ation)?)\s*[:=]\s*(\d{1,15})"
                        r"(?:st|nd|rd|th)?(?:\s+steps?)?\s*[.:]?\s*$", re.IGNORECASE)
# glog's line prefix (absl, torch's C++ and `torch._logging`): `W0530 14:48:26.433000 2622492 file.py:1233] `;
# an I/W line is information or a warning, never a crash, whatever it quotes
_GLOG = re.compile(r"^[IW]\d{4} \d\d:\d\d:\d\d(?:\.\d+)?\s+\d+\s+[^\]\s]+:\d+\] ")
# a shell prompt with a command after it (`user@host:~/dir$ python infer.py ...`): a new launch starts
_PROMPT = re.compile(r"^[\w.\-]+@[\w.\-]+:[^\s$#]*[$#] +\S")
# `Epoch: [3][50]` (SwAV, DINO, MoCo's ProgressMeter without its `/N`): the epoch, then the iteration within it
_EPOCH_AT = re.compile(r"\bepoch\b\s*[:=]?\s*\[\s*(\d{1,9})\s*\]\s*\[\s*(\d{1,12})\s*[/\]]", re.IGNORECASE)
# one metric of a multi-line record (a declared `block_head` opens it): an indented `name=value`, a name of
# several words allowed (`System/Peak GPU Memory (MB)`), a value with thousands commas (`10,919`)
_BLOCK_ROW = re.compile(r"^\s{2,}([A-Za-z][^=]{0,120}?)\s*=\s*(" + _NUM + r"|-?\d{1,3}(?:,\d{3})+(?:\.\d+)?)\s*$",
                        re.IGNORECASE)
# a tqdm bar of unknown total (`Validation: |          | 0/? [00:00<?, ?it/s]`, Lightning's before its first
# batch) with another line glued after it (a logger's line printed while the bar is drawn)
_UNKNOWN_BAR = re.compile(r"^[^|\n]{0,80}\|[^|\n]{0,200}\|\s*\d{1,12}/\?\s*\[[^\]]{0,200}\]")
# Lightning's training bar, described by its epoch (`Epoch 14: 100%|###| 352/352 [...]`)
_BAR_EPOCH = re.compile(r"^\s*Epoch (\d{1,9}):\s")
# a line that is no statement at all (a stray `50`, `---`): it neither ends nor continues the run
_LR_PRINTED = re.compile(r"\b(?:lr|learning[_ ]rate)\s*[:=]?\s*0\.(0+)(?![\d.eE])", re.IGNORECASE)
_WORD_BEFORE = re.compile(r"([A-Za-z]\w{0,30})\s+$")
_STRAY = re.compile(r"^[\W\d_]{0,8}$")
# a line of many words that merely holds numbers (`[eval] A car travels at 62 km/h for 2 hours`): not metrics
_WORD = re.compile(r"[A-Za-z]{2,}")


# every declared plan setting's name holds one of these (checked in tests): a line without any is no setting
_PLAN_HINTS = ("max", "num", "total", "epochs", "train_", "learning_steps", "anneal", "batch", "scheduled", "n_epoch")


class _Contracts:
    """The union of every printed format's declared rules, compiled once (see `ingest.formats._text`)."""

    def __init__(self) -> None:
        from trainguard.ingest.formats._text import text_rules

        rules = text_rules()
        self.completion = _union(p for r in rules for p in r.completion)
        # a literal each completion pattern needs (lower-cased): most lines hold none, and one substring test
        # per hint costs a fraction of the union's search on a 1 GB log; a pattern without one: always searched
        hints = [_literal(p) for r in rules for p in r.completion]
        self.completion_hints = None if any(h is None for h in hints) else tuple(sorted({h for h in hints if h}))
        self.not_eval = _union(p for r in rules for p in r.not_evaluation)
        self.samples = [re.compile(r.sample_counter, re.IGNORECASE) for r in rules if r.sample_counter]
        self.weighted = _union(r.weighted_parts for r in rules if r.weighted_parts)
        self.closing = _union(p for r in rules for p in r.closing)
        self.launch = _union(p for r in rules for p in r.launch)
        self.block_head = _union(r.block_head for r in rules if r.block_head)
        self.parts_after = _union(r.parts_after for r in rules if r.parts_after)
        # the short names a writer gives a position or a metric, each with the lines it applies on
        self.keys: list[tuple[re.Pattern[str] | None, dict[str, str]]] = [
            (re.compile(r.keys_when, re.IGNORECASE) if r.keys_when else None, {k.lower(): v for k, v in r.keys.items()})
            for r in rules if r.keys]
        self.records: dict[str, str] = {}
        for r in rules:
            self.records.update(r.record_lines)
        kinds = {"steps": {k.lower() for r in rules for k in r.plan_steps},
                 "epochs": {k.lower() for r in rules for k in r.plan_epochs},
                 "batch": {k.lower() for r in rules for k in r.batch_size}}
        self.plan_kind = {_norm(k): kind for kind, ks in kinds.items() for k in ks}
        keys = sorted(set().union(*kinds.values()), key=len, reverse=True)
        # `epochs: 400`, `max_epochs=100`, `--learning_steps 50000`, `'num_train_epochs': 3.0`, `Num Epochs = 3`,
        # `Total optimization steps = 14,007`: a setting's name (a whole word), then its value
        names = "|".join(re.escape(k).replace(r"\ ", r"[ _]") for k in keys)
        self.plan = re.compile(r"(?<![\w.\-])(?:--)?(" + names + r")['\"]?\s*(?:[:=]\s*|\s+)(\d{1,3}(?:,\d{3})+|\d{1,12})"
                               r"(?:\.0+)?(?![\w./]|,\d)", re.IGNORECASE)


def _literal(pattern: str) -> str | None:
    """The longest run of plain lower-case letters and spaces (3 or more) that a pattern must match, if any:
    text outside every group, class and escape (a group's alternatives are not each required)."""
    plain = re.sub(r"\\.", "\0", pattern.lower())
    while (shorter := re.sub(r"\([^()]*\)[?*+]?|\[[^\]]*\][?*+]?", "\0", plain)) != plain:
        plain = shorter
    if "|" in plain:
        return None  # alternatives at the top: no one literal is required
    plain = re.sub(r".[?*]", "\0", plain)  # an optional character is not required either
    runs = [r.strip() for r in re.findall(r"[a-z][a-z ]{2,}", plain)]
    runs = [r for r in runs if len(r) >= 3]
    return max(runs, key=len) if runs else None


def _norm(name: str) -> str:
    return re.sub(r"[\s\-]+", "_", name.lower())


def _union(patterns: Any) -> re.Pattern[str] | None:
    parts = [f"(?:{p})" for p in patterns]
    return re.compile("|".join(parts), re.IGNORECASE | re.MULTILINE) if parts else None


@functools.lru_cache(maxsize=1)
def contracts() -> _Contracts:
    return _Contracts()


# PyTorch's own warnings that name a training bug: (name, pattern). `diagnose` makes findings of them.
TORCH_WARNINGS: list[tuple[str, re.Pattern[str]]] = [
    (SCHEDULER_BEFORE_OPTIMIZER.name,
     re.compile(r"Detected call of `lr_scheduler\.step\(\)` before `optimizer\.step\(\)`")),
]


def read_text_log(path: Path) -> Source:
    """A Source over a log file; its events are read lazily, in one pass, in constant memory."""
    facts = Facts()
    with open(path, "rb") as f:
        head = f.read(8192)
        while head and not head.strip(b"\x00") and len(head) < 4 * BLOCK:
            # a log that starts with a hole of NUL bytes (truncated under its writer): its text comes after
            if not (more := f.read(BLOCK)):
                break
            head += more
        sniff_binary(head.lstrip(b"\x00")[:8192] or head[:8192], path)
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
    if "\x00" in text:
        text = text.replace("\x00", "")  # a hole a truncated log left (see `sniff_binary`)
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
        self.closing: str | None = None  # a closing line (declared `closing`) no training step has followed yet
        # a launch started at a shell prompt: how the launch before it stood, kept in case this one never trains
        self.before_launch: dict[str, Any] | None = None
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

    def feed(self, lineno: int, line: str) -> list[dict[str, Any]]:
        """The events one line brings, a `launch` event (see `_returns`) before the line's own."""
        out = self._feed(lineno, line)
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
        facts.last_line = stripped[:500]
        if not _STRAY.match(stripped):
            facts.last_word = facts.last_line
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

    def finish(self) -> None:
        """At the end of the log: the run held against the plan it states (see the module docstring)."""
        facts = self.facts
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

    def _steps_of_epochs(self, epochs: int, per: int, at: tuple[int, int]) -> str:
        total = epochs * per
        return (f"step {self.step:,} of {total:,} ({100 * self.step / total:.1f}%), step {at[1]:,} of {per:,} in "
                f"epoch {at[0]} of {epochs}")

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

    def _metrics(self, line: str) -> list[dict[str, Any]]:
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

    def _position(self, line: str, epoch: tuple[int, int | None] | None, train: bool) -> int | None:
        """The step of a metric line, on the run's one step axis: a declared sample counter becomes batches,
        `[epoch, iter]` and per-epoch counters become absolute; an evaluation's own progress
        (`Epoch(val) [1][5/5]`) counts evaluation batches, not steps."""
        if train:
            for pattern in self.c.samples:
                if (m := pattern.search(line)) is not None:
                    return self._samples(int(m.group(1)), int(m.group(2)), int(m.group(3)))
            if "," in line and (m := _EPOCH_ITER.search(line)) is not None:
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
    out: dict[str, float] = {}
    for m in _PAIR.finditer(line):  # _NUM only matches what float() reads
        key = _key(m.group(1))
        if key in out and (word := _WORD_BEFORE.search(line, 0, m.start(1))) is not None:
            # `Loss: 50.14  Rc Loss: 50.04  KL Loss: 0.99`: the later ones are terms under their own words, not
            # the total overwritten; not parts either: whether (and with what weights) they sum is not printed
            key = _key(f"{word.group(1)}_{key}_term")
        out.setdefault(key, float(m.group(2)))
    if "/" in line:
        for m in _PAIR.finditer(line):
            if line.startswith(("/", " /"), m.end()) and (frac := _FRACTION.match(line, m.end())) is not None \
                    and (key := _key(m.group(1))) not in _NOT_METRICS and int(frac.group(1)):
                # `Accuracy: 9897/10000 (99%)` (pytorch/examples' test line): a fraction, not a count
                out[key] = float(m.group(2)) / int(frac.group(1))
    if line.count("|") >= 2:  # `| lr 20.0000 | loss   nan |`: each cell a name and its number
        table, rest = {}, []
        for cell in line.split("|"):
            if (c := _CELL.fullmatch(cell.strip())) is not None:
                table[_key(c.group(1))] = float(c.group(2))
            else:
                rest.append(cell)
        if table:
            # a cell's whole name (`Task Loss: 3.29 || KD Loss: 1.61`), not its last word read as `loss`
            out = {_key(k): float(v) for k, v in _PAIR.findall("|".join(rest))}
            out.update(table)
    for k in [k for k in out if k.endswith(("_set", "_split"))]:
        # `Accuracy on validation set: 10.3 %`: the metric is the word before, not `set`
        on = _ON_SET.search(line)
        out[f"{k.split('_', 1)[0]}_{on.group(1).lower() if on else 'score'}"] = out.pop(k)
    # `loss 4.70 (-2.05z)| norm 1.2 | lr 6e-4` (llm.c), `Loss 3.91 (3.95)\tLr: 0.59` (SwAV): a spaced loss, LR or
    # norm beside other pairs is read too
    low = line.lower()
    if "loss " in low or "lr " in low or "norm " in low or "rate " in low:
        for k, v in _SPACED.findall(line):
            out.setdefault(_key(k), float(v))
    if not out and _eval_line(line):
        loose = _LOOSE.findall(line)
        # `Validation BLEU-1 73.98, BLEU-2 68.28`, not a sentence that holds numbers (`[eval] A car travels at
        # 62 km/h for 2 hours`): the words that name no number must be few
        if loose and len(_WORD.findall(line)) <= 2 * len(loose) + 1:
            out = {_key(k): float(v) for k, v in loose}
    return {k: v for k, v in out.items() if (not k.endswith("epoch") or k == "epoch") and not _is_count(k)}


def _is_count(key: str) -> bool:
    """`total_sample`, `num_images`, `train_size`: a count of things, not a metric."""
    return key.rsplit("_", 1)[-1] in _COUNTS and key not in _NOT_METRICS


def _summary_loss(pairs: dict[str, float]) -> float | None:
    """An epoch summary's training loss (`average_training_loss`, `avg_train_loss`), not a validation one."""
    for k, v in pairs.items():
        if k.startswith(_SUMMARY) and k.endswith("loss") and not any(w in k for w in ("val", "test", "eval", "dev")):
            return v
    return None


def _eval_line(line: str) -> bool:
    """A line that says it is an evaluation (`[Eval]`, `Validation BLEU`, `Dev BLEU`, `| valid loss |`)."""
    low = line.lower()
    # every word looked for holds one of these: the substring test costs a tenth of the search
    return ("val" in low or "dev" in low or "test" in low) and _EVAL_WORD.search(line) is not None


@functools.lru_cache(maxsize=1024)
def _key(name: str) -> str:
    key = "_".join(name.lower().split())
    if key == "norm":
        return "grad_norm"  # llm.c's and build-nanogpt's `norm`: the gradient norm
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
    closed = parser.close_block()
    yield from parser.queued + closed
    parser.finish()
    if parser.step:
        # newline-ended lines only: a tqdm bar's carriage-return redraws scroll nothing
        yield event("output", parser.step, {"lines": max(0, facts.newlines - parser.block_rows)})
    if parser.tb is not None and len(parser.tb) > 1:
        facts.traceback = parser.tb  # a traceback cut off by the end of the file
