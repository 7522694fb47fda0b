"""What one printed line of a training log says, line by line and without state: the patterns the text
reader (`ingest.textlog`) matches, the union of every printed format's declared contract (`contracts()`), and
the pure helpers that read a line's named numbers (`_pairs`), its epoch (`_epoch_of`), whether it is an
evaluation (`_eval_line`), and what its keys mean (`_key`, `_eval_key`, `_part_names`).

The per-line code that uses these is hot (a log may be a gigabyte): the readers import each name into their
own module, so a use is one global look-up, as before these lived apart.
"""

from __future__ import annotations

import functools
import re
from typing import Any

from trainguard.ingest.signs import SCHEDULER_BEFORE_OPTIMIZER

_NUM = r"[-+]?(?:nan|inf(?:inity)?|\d+(?:\.\d*)?(?:e[-+]?\d+)?|\.\d+(?:e[-+]?\d+)?)"
# `loss=2.3`, `Loss: 2.3`, and with the words that qualify a name in front: `Train Loss: 1.12`,
# `Batch loss: 12.1`, `Val Loss: 1.36` (only these words, so `INFO root loss: 2` stays `loss`)
_QUALIFIER = r"(?:(?:train|training|val|valid|validation|eval|evaluation|test|dev|batch|average|avg|mean|epoch|total|running)\s+){0,2}"
# a key starts where a word starts: without the look-behind a 64 KiB run of letters (a base64 blob) is
# tried from each of its positions, quadratic in the line (minutes for one line)
_END = r"(?!\w|\.\d)"  # where a number ends: `Loss: 0.2154.` ends a sentence, `1.2.3` is no number
_PAIR = re.compile(r"(?<![\w/.\-])(" + _QUALIFIER + r"[A-Za-z][\w/.\-]*)\s*[=:]\s*(" + _NUM + r")" + _END,
                   re.IGNORECASE)
# an LR printed as a list, one per parameter group (`lr: [0.00999]`, `Lr: [0.01, 0.01]`, `lr=[0.0001]`)
_LIST_LR = re.compile(r"(?<![\w/.\-])(lr|learning[_ ]rate)\s*[=:]\s*\[\s*(" + _NUM + r")\s*(?:,\s*" + _NUM
                      + r"\s*){0,63}\]", re.IGNORECASE)
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
# a Python logging record at a level below ERROR that quotes a traceback: `[2023-11-29 11:04:57,788]
# torch._dynamo.convert_frame: [WARNING] Traceback (most recent call last):` (torch 2.0/2.1's `torch._logging`
# format `[%(asctime)s] %(name)s: [%(levelname)s] %(message)s`), `2024-01-02 10:00:00 - trainer - WARNING -
# Traceback ...`. The logger writes every line of the quoted traceback behind the same prefix; a handled
# exception (a compile fallback, a retried download) the run went on from, never the run's end
QUOTED_TB_LEVELS = ("WARNING", "WARN", "INFO", "DEBUG")
_QUOTED_TB = re.compile(r"^(?P<prefix>\S.*?[\[\s|:\-](?:" + "|".join(QUOTED_TB_LEVELS) + r")[\]\s|:\-]\s*(?:[-|:]\s*)?)"
                        r"Traceback \(most recent call last\)")
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
_BEFORE = 128  # characters looked back for it: a search from the line's start made a long line quadratic
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
        self.abbreviated = _union(r.abbreviated for r in rules if r.abbreviated)
        self.parts_after = _union(r.parts_after for r in rules if r.parts_after)
        # tables printed without names on their rows: (header, columns), and the header's literal words (a line
        # with none of them is no header: one substring test instead of each header's search)
        self.columns = [(re.compile(head, re.IGNORECASE), cols) for r in rules for head, cols in r.columns]
        self.columns_hints = tuple(sorted({h for r in rules for head, _ in r.columns if (h := _literal(head))}))
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


MAX_COUNT = 1e18  # steps or samples no run reaches; a longer print is damage
_SUFFIX = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "T": 10**12, "Q": 10**15}


def exact_count(printed: str, last: int | None, every: int | None) -> int | None:
    """The count a big-number print stands for (`1K`: 500 <= n < 1500 as rounded to 0 decimals): the last
    count plus the cadence when the print allows it, else the print's nominal value; None for a print no
    count could be (hundreds of digits: past any float)."""
    unit = _SUFFIX[printed[-1]] if printed[-1] in _SUFFIX else 1
    nominal = float(printed[:-1] if unit > 1 else printed) * unit
    if not nominal < MAX_COUNT:
        return None
    if last is not None and every and unit > 1 and abs(last + every - nominal) <= unit / 2:
        return last + every
    return int(nominal)


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
        if key in out and (word := _WORD_BEFORE.search(line, max(0, m.start(1) - _BEFORE), m.start(1))) is not None:
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
    if "[" in line and (lr := _LIST_LR.search(line)) is not None:
        # `lr: [0.00999]` (HRNet-seg, DeepSpeed's `lr=[0.0001]`), `Lr: [0.01, 0.01]`: one LR per parameter
        # group, printed as a list; the first group's is the run's LR, as `lr/pg0` is in the YOLO writers
        out.setdefault(_key(lr.group(1)), float(lr.group(2)))
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
