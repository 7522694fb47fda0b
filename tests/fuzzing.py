"""A seeded fuzzer for every reader of trainguard and for `trainguard check`.

    python tests/fuzzing.py --cases 5000 [--target textlog] [--seed 1] [--keep DIR]

Each case is a plausible input (a log, a metrics table, a trainer_state.json, TensorBoard records, a run
folder, a training config) damaged the way real files are damaged and the way a hostile one would be:
truncated, bytes flipped, lines glued or doubled, control characters and terminal escapes, numbers of
thousands of digits, nesting thousands deep, YAML aliases that expand exponentially, a FIFO instead of a
file. The CLI command that reads it runs in this process, as a user would call it. A case fails when the
command raises (a traceback), exits 70 (an internal error), runs past its time limit (a hang), or prints
a raw control character. Memory is the peak resident size of this process over the whole run.

The generator is seeded and the cases depend only on (seed, target, index): a failure printed as
`textlog#123` is reproduced with `--target textlog --first 123 --cases 1`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import resource
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CASE_TIMEOUT = 60  # seconds one case may take before it counts as a hang (the slowest real case takes ~10 s alone)
# a raw control character in what the CLI printed (newline and tab are fine; \x1b starts an escape sequence)
_RAW_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f\x9b]")

# ---------------------------------------------------------------------------------------------------------
# pieces of hostile text

ESCAPES = ["\x1b[2J", "\x1b]0;owned\x07", "\x1b[31mred", "\x07", "\x00", "\r", "\x08\x08", "\x9b31m", "\u202e"]
HTML = ["<script>alert(1)</script>", "<img src=x onerror=alert(1)>", "]]><!--", "&lt;&amp;", "`rm -rf`"]


def _big_int(rng: random.Random) -> str:
    digits = rng.choice([20, 4301, 5000])  # Python refuses to convert more than 4300 digits
    chunk = str(rng.randrange(10**17, 10**18))
    return (chunk * (digits // 18 + 1))[:digits]


_NUMBERS = ["nan", "inf", "-inf", "NaN", "1e309", "-0", "0x1f", "1_000", "", "1.2.3"]


def _number(rng: random.Random) -> str:
    roll = rng.random()
    if roll < 0.5:
        return f"{rng.uniform(0, 10):.4f}" if roll < 0.3 else f"{rng.uniform(0, 1):.2e}"
    if roll < 0.55:
        return _big_int(rng)
    if roll < 0.7:
        return str(rng.randint(-5, 10**6))
    return rng.choice(_NUMBERS)


def _garbage(rng: random.Random, n: int = 40) -> str:
    alphabet = "abc xyz{}[]:,=|/\\'\"\t" + "".join(ESCAPES) + "".join(HTML) + "é漢\ud7ff"
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(1, n)))


def _mutate(data: bytes, rng: random.Random) -> bytes:
    """Damage as files get damaged: truncation, flipped bytes, a block repeated or dropped, junk inserted."""
    data = bytearray(data)
    for _ in range(rng.randint(0, 4)):
        op = rng.randrange(7)
        if not data:
            data += _garbage(rng).encode("utf-8", "surrogatepass")
            continue
        i = rng.randrange(len(data))
        if op == 0:
            del data[rng.randrange(len(data)):]
        elif op == 1:
            for _ in range(rng.randint(1, 8)):
                data[rng.randrange(len(data))] = rng.randrange(256)
        elif op == 2:
            j = min(len(data), i + rng.randint(1, 200))
            data[i:i] = data[i:j] * rng.randint(1, 20)
        elif op == 3:
            del data[i:i + rng.randint(1, 100)]
        elif op == 4:
            data[i:i] = _garbage(rng).encode("utf-8", "surrogatepass")
        elif op == 5:
            data[i:i] = rng.choice([b"\r", b"\n" * 50, b"\x00" * 10, b"\xff\xfe", b"\x1b[2J"])
        else:
            data[i:i] = _number(rng).encode()
    return bytes(data)


def _deep_json(rng: random.Random) -> str:
    depth = rng.choice([100, 5000, 100_000])
    opener, closer = rng.choice([("[", "]"), ('{"a":', "}")])
    return opener * depth + "1" + closer * depth


# ---------------------------------------------------------------------------------------------------------
# inputs, one generator per reader; each writes its case into `folder` and returns the CLI arguments


def gen_textlog(rng: random.Random, folder: Path) -> list[str]:
    lines = []
    step = 0
    for _ in range(rng.randint(0, 300)):
        step += rng.choice([1, 1, 10, 0, -5])
        kind = rng.randrange(10)
        if kind == 0:
            lines.append(f"step {step} | loss {_number(rng)} | lr {_number(rng)} | grad_norm {_number(rng)}")
        elif kind == 1:
            lines.append(f"{{'loss': {_number(rng)}, 'learning_rate': {_number(rng)}, 'epoch': {_number(rng)}}}")
        elif kind == 2:
            lines.append(f"Epoch {rng.randint(0, 9)}: {rng.randint(0, 100)}%|███▌ | {step}/1000 "
                         f"[00:{rng.randint(10, 59)}<01:00, 2.1it/s, loss={_number(rng)}]\r")
        elif kind == 3:
            lines += ["Traceback (most recent call last):", f'  File "train.py", line {rng.randint(1, 999)}, in <module>',
                      f"    {_garbage(rng)}", f"{rng.choice(['ValueError', 'RuntimeError', 'X'])}: {_garbage(rng)}"]
        elif kind == 4:
            lines.append(f"iter {step}: loss {_number(rng)}, time {_number(rng)}ms, mfu {_number(rng)}%")
        elif kind == 5:
            lines.append(f"eval step {step}: val_loss={_number(rng)} acc={_number(rng)} {rng.choice(ESCAPES)}")
        elif kind == 6:
            lines.append(_garbage(rng, 200))
        elif kind == 7:
            # long lines; now and then one of megabytes (memory must stay bounded per line)
            lines.append("x" * (2_000_000 if rng.random() < 0.02 else rng.choice([10, 70_000])) + f" loss {_number(rng)}")
        elif kind == 8:
            lines.append(f"{step}\t{_number(rng)}\t{_number(rng)}")
        else:
            lines.append(f"[rank{rng.randint(0, 3)}]: step={step} loss={_number(rng)} {rng.choice(HTML)}")
    data = _mutate("\n".join(lines).encode("utf-8", "surrogatepass"), rng)
    path = folder / rng.choice(["train.log", "output.log", "stdout.txt"])
    path.write_bytes(data)
    return ["diagnose", str(path)]


def gen_csv(rng: random.Random, folder: Path) -> list[str]:
    cols = rng.sample(["step", "epoch", "train_loss", "val_loss", "lr-AdamW", "train/box_loss", "metrics/mAP50(B)",
                       "loss", "", "step", _garbage(rng, 10)], rng.randint(0, 6))
    rows = [",".join(cols)]
    for i in range(rng.randint(0, 200)):
        rows.append(",".join(rng.choice([str(i), _number(rng), "", '"1,2"', _garbage(rng, 8)]) for _ in cols))
    name = rng.choice(["metrics.csv", "results.csv", "log.csv"])
    (folder / name).write_bytes(_mutate("\n".join(rows).encode("utf-8", "surrogatepass"), rng))
    return ["diagnose", str(folder / name if rng.random() < 0.7 else folder)]


def gen_jsonl(rng: random.Random, folder: Path) -> list[str]:
    lines = []
    for i in range(rng.randint(0, 200)):
        roll = rng.random()
        if roll < 0.05:
            lines.append(_deep_json(rng))
        elif roll < 0.1:
            lines.append(f'{{"step": {_big_int(rng)}, "loss": {_big_int(rng)}}}')
        else:
            obj = {"step": rng.choice([i, str(i), None, -1, 1.5, [i]]), "loss": rng.choice([rng.random(), "nan", None]),
                   rng.choice(["lr", "eval_loss", "x"]): rng.choice([1e-4, {"a": 1}, _garbage(rng)])}
            lines.append(json.dumps(obj))
    path = folder / rng.choice(["metrics.jsonl", "log.ndjson", "metrics.json"])
    path.write_bytes(_mutate("\n".join(lines).encode("utf-8", "surrogatepass"), rng))
    return ["diagnose", str(path)]


def gen_trainer_state(rng: random.Random, folder: Path) -> list[str]:
    history = []
    for i in range(1, rng.randint(0, 150) + 1):
        entry = {"step": rng.choice([i * 10, str(i), None, -i]), "epoch": i / 10,
                 rng.choice(["loss", "eval_loss", "learning_rate", "grad_norm"]): rng.choice(
                     [rng.random(), float("nan"), None, "x", [1], {"a": 1}])}
        history.append(entry)
    state: dict[str, Any] = {"log_history": history, "max_steps": rng.choice([1500, 0, -1, None, "x", 10**30]),
                             "logging_steps": 10, "eval_steps": rng.choice([100, None, 0.5])}
    text = json.dumps(state)
    roll = rng.random()
    if roll < 0.1:
        text = text.replace('"max_steps": ', f'"max_steps": {_big_int(rng)}, "x": ', 1)
    elif roll < 0.2:
        text = '{"log_history": ' + _deep_json(rng) + "}"
    elif roll < 0.3:
        text = text.replace('"log_history": [', '"log_history": [' + ",".join(["[[[]]]"] * 50) + ",", 1)
    where = folder / "out"
    where.mkdir()
    if rng.random() < 0.3:
        (where / f"checkpoint-{rng.choice(['10', '0', '9' * 30, 'x'])}").mkdir(exist_ok=True)
        path = where / f"checkpoint-{rng.randint(1, 99)}"
        path.mkdir(exist_ok=True)
        path = path / "trainer_state.json"
    else:
        path = where / "trainer_state.json"
    path.write_bytes(_mutate(text.encode(), rng))
    return ["diagnose", str(rng.choice([path, where]))]


_TB_TEMPLATE: bytes | None = None


def _tb_template() -> bytes:
    """A real TensorBoard event file written by TensorBoard's own writer (made once, then damaged)."""
    global _TB_TEMPLATE
    if _TB_TEMPLATE is None:
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        with tempfile.TemporaryDirectory() as d:
            w = EventFileWriter(d)
            for step in range(60):
                for tag, v in (("train/loss", 3.0 / (step + 1)), ("lr", 1e-4), ("val/loss", 2.0)):
                    summ = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, simple_value=v)])
                    w.add_event(event_pb2.Event(step=step, wall_time=1e9 + step, summary=summ))
            w.close()
            _TB_TEMPLATE = next(Path(d).iterdir()).read_bytes()
    return _TB_TEMPLATE


def gen_tensorboard(rng: random.Random, folder: Path) -> list[str]:
    path = folder / f"events.out.tfevents.{rng.randint(1, 10**9)}.host"
    path.write_bytes(_mutate(_tb_template(), rng) if rng.random() < 0.9 else _garbage(rng).encode("utf-8", "surrogatepass"))
    return ["diagnose", str(rng.choice([path, folder]))]


_RUN_TEMPLATE: dict[str, bytes] | None = None


def _run_template() -> dict[str, bytes]:
    """A real run folder (run.db, status.json, output.log) written by the probe's own store writer."""
    global _RUN_TEMPLATE
    if _RUN_TEMPLATE is None:
        from trainguard.store.status import write_status
        from trainguard.store.writer import StoreWriter

        with tempfile.TemporaryDirectory() as d:
            w = StoreWriter(d)
            w.set_meta("plan", {"total_steps": 100})
            w.set_meta("command", ["python", "train.py", "\x1b[2J"])
            for step in range(1, 80):
                w.add_step({"step": step, "t": 1e9 + step, "loss": 3.0 / step, "lr": 1e-4, "parts": {"<b>kd</b>": 1.0}})
            w.add_event("phase", "eval\x1b[31m", {"edge": "begin"}, step=40)
            w.add_event("crash", "ValueError", {"exception": "ValueError", "message": "<script>x</script>\x1b]0;t\x07",
                                                "frames": [{"file": "train.py", "line": 3, "function": "f"}]}, step=79)
            w.close()
            write_status(d, {"state": "crashed", "step": 79, "pid": 1, "findings": [
                {"code": "TG501", "name": "run-crashed", "severity": "error", "step": 79,
                 "summary": "ValueError: <img src=x onerror=alert(1)> \x1b[2J", "evidence": {"m": "\x07"},
                 "fix": "x", "where": "train.py:3 (\x1b[31mf)"}]})
            (Path(d) / "output.log").write_bytes(b"step 1 loss 3.0\n\x1b[2Jstep 2 loss 2.0\n")
            _RUN_TEMPLATE = {p.name: p.read_bytes() for p in Path(d).iterdir() if p.is_file()}
    return _RUN_TEMPLATE


def gen_run_folder(rng: random.Random, folder: Path) -> list[str]:
    run = folder / "run"
    run.mkdir()
    for name, data in _run_template().items():
        if name.endswith(("-wal", "-shm")):
            continue
        roll = rng.random()
        if roll < 0.1:
            continue  # the file is missing
        if name == "status.json" and roll < 0.3:
            data = rng.choice([_deep_json(rng).encode(), b'{"state": ' + _big_int(rng).encode() + b"}", b"[]",
                               b'{"state": "running", "owner": {"pid": "x"}, "findings": [1, "a", null]}',
                               json.dumps({"state": "running", "step": "x", "pid": -1, "owner": {"pid": 2**40},
                                           "findings": {"a": 1}}).encode()])
        elif roll < 0.7:
            data = _mutate(data, rng)
        (run / name).write_bytes(data)
    command = rng.choice([["status", str(run)], ["report", str(run), "--print"], ["diagnose", str(run)],
                          ["status", str(run), "--json"]])
    return command


_CONFIG_KEYS = ["num_train_epochs", "per_device_train_batch_size", "gradient_accumulation_steps", "learning_rate",
                "lr_scheduler_type", "warmup_ratio", "warmup_steps", "eval_steps", "save_steps", "max_steps",
                "early_stopping_patience", "dataset_size", "eval_strategy", "logging_steps"]


def _alias_bomb(levels: int) -> str:
    out = ['a0: &a0 ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    for i in range(1, levels):
        out.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    return "\n".join(out) + f"\nlearning_rate: *a{levels - 1}\n"


def gen_check(rng: random.Random, folder: Path) -> list[str]:
    fmt = rng.choice(["yaml", "yaml", "json"])
    cfg: dict[str, Any] = {}
    for key in rng.sample(_CONFIG_KEYS, rng.randint(0, len(_CONFIG_KEYS))):
        cfg[key] = rng.choice([rng.randint(-3, 5000), rng.random(), "cosine", "steps", None, "1e-4", [1, 2],
                               {"x": 1}, True, float("nan"), 10**30, _garbage(rng, 10)])
    if rng.random() < 0.2:
        cfg = {rng.choice(["training", "trainer", "optim"]): cfg, "model": {"name": _garbage(rng, 20)}}
    roll = rng.random()
    if fmt == "json":
        text = json.dumps(cfg)
        if roll < 0.1:
            text = '{"learning_rate": ' + _big_int(rng) + "}"
        elif roll < 0.2:
            text = '{"a": ' + _deep_json(rng) + "}"
    else:
        import yaml

        text = yaml.safe_dump(cfg, allow_unicode=True)
        if roll < 0.08:
            text = _alias_bomb(rng.randint(3, 12))
        elif roll < 0.12:
            text = "a: &x [*x]\n" if rng.random() < 0.5 else "a: &x {b: *x}\nlearning_rate: 1\n"
        elif roll < 0.16:
            text = "x: " + "[" * rng.choice([100, 3000, 50_000]) + "\n"
        elif roll < 0.2:
            text = f"learning_rate: {_big_int(rng)}\nmax_steps: !!int {_big_int(rng)}\n"
        elif roll < 0.24:
            text = "x: !!python/object/apply:os.system ['echo hi']\n"
        elif roll < 0.28:
            text = "\n".join(f"k{i}: &k{i} {rng.choice(ESCAPES + HTML)!r}" for i in range(30))
    path = folder / f"config.{fmt if rng.random() < 0.9 else 'yml'}"
    path.write_bytes(_mutate(text.encode("utf-8", "surrogatepass"), rng) if rng.random() < 0.5 else text.encode(
        "utf-8", "surrogatepass"))
    args = ["check", str(path)]
    if rng.random() < 0.3:
        args += ["--dataset-size", str(rng.choice([1, 0, 10**6]))]
    if rng.random() < 0.2:
        args += ["--fix", "--output", str(folder / f"fixed.{fmt}")]
    return args


def gen_special(rng: random.Random, folder: Path) -> list[str]:
    """Special files where a file is expected: a FIFO (nobody writes it), /dev/zero, a folder of the name."""
    kind = rng.choice(["fifo", "zero", "dir"])
    name = rng.choice(["train.log", "metrics.csv", "trainer_state.json", "config.yaml", "status.json",
                       "events.out.tfevents.1.h", "metrics.jsonl"])
    path = folder / name
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "zero":
        path.symlink_to("/dev/zero")
    else:
        path.mkdir()
    if name == "status.json":
        return [rng.choice(["status", "report", "diagnose"]), str(folder)]
    if name == "config.yaml":
        return ["check", str(path)]
    return ["diagnose", str(rng.choice([path, folder]))]


TARGETS: dict[str, Callable[[random.Random, Path], list[str]]] = {
    "textlog": gen_textlog, "csv": gen_csv, "jsonl": gen_jsonl, "trainer_state": gen_trainer_state,
    "tensorboard": gen_tensorboard, "run_folder": gen_run_folder, "check": gen_check, "special": gen_special,
}


# ---------------------------------------------------------------------------------------------------------
# the harness


@dataclass
class Tally:
    cases: int = 0
    exit_codes: dict[int, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    slowest: float = 0.0

    def ok(self) -> bool:
        return not self.failures


class _Hang(BaseException):  # not an Exception: the CLI must not turn it into an exit code
    pass


@contextlib.contextmanager
def _time_limit(seconds: int) -> Iterator[None]:
    def alarm(signum: int, frame: Any) -> None:
        raise _Hang()

    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def run_case(target: str, seed: int, index: int, keep: Path | None = None) -> tuple[int | None, str | None, float]:
    """One case: (exit code, failure or None, seconds)."""
    from click.testing import CliRunner

    from trainguard.cli import main

    rng = random.Random(f"{seed}:{target}:{index}")
    with tempfile.TemporaryDirectory(prefix="tgfuzz-") as d:
        folder = Path(d)
        args = TARGETS[target](rng, folder)
        runner = CliRunner()
        t0 = time.perf_counter()
        failure = None
        code: int | None = None
        env = {"TRAINGUARD_DEBUG": None, "TRAINGUARD_RUNS": str(folder / "runs")}
        try:
            with _time_limit(CASE_TIMEOUT):
                result = runner.invoke(main, args, catch_exceptions=True, env=env)
            code = result.exit_code
            out = result.stdout + (result.stderr if _stderr_separate(result) else "")
            if result.exception is not None and not isinstance(result.exception, SystemExit):
                failure = f"traceback {type(result.exception).__name__}: {str(result.exception)[:200]}"
                if isinstance(result.exception, _Hang):
                    failure = f"hang (> {CASE_TIMEOUT} s)"
            elif code == 70:
                failure = f"exit 70: {out.strip().splitlines()[-1][:300] if out.strip() else ''}"
            elif code not in (0, 1, 2):
                failure = f"exit {code}"
            elif "Traceback (most recent call last)" in out:
                failure = "a traceback was printed"
            elif m := _RAW_CONTROL.search(out):
                failure = f"raw control character {m.group()!r} in the output"
        except _Hang:
            failure = f"hang (> {CASE_TIMEOUT} s)"
        seconds = time.perf_counter() - t0
        if failure and keep is not None:
            dest = keep / f"{target}-{index}"
            dest.mkdir(parents=True, exist_ok=True)
            (dest / "args.json").write_text(json.dumps(args))
            (dest / "failure.txt").write_text(failure)
        return code, failure, seconds


def _stderr_separate(result: Any) -> bool:
    try:
        return bool(result.stderr)
    except ValueError:
        return False


def fuzz(targets: list[str], cases: int, seed: int = 1, first: int = 0, keep: Path | None = None,
         progress: bool = False) -> dict[str, Tally]:
    tallies = {}
    for target in targets:
        tally = Tally()
        for index in range(first, first + cases):
            code, failure, seconds = run_case(target, seed, index, keep)
            tally.cases += 1
            tally.exit_codes[code if code is not None else -1] = tally.exit_codes.get(code if code is not None else -1, 0) + 1
            tally.slowest = max(tally.slowest, seconds)
            if failure:
                tally.failures.append(f"{target}#{index}: {failure}")
            if progress and tally.cases % 250 == 0:
                print(f"  {target}: {tally.cases} cases, exit codes {dict(sorted(tally.exit_codes.items()))}, "
                      f"{len(tally.failures)} failures, slowest {tally.slowest:.1f} s, "
                      f"peak memory {peak_rss_mib():.0f} MiB", file=sys.stderr, flush=True)
        tallies[target] = tally
    return tallies


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=200, help="cases per target")
    ap.add_argument("--target", action="append", choices=sorted(TARGETS), help="repeatable; default: all")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--first", type=int, default=0, help="index of the first case")
    ap.add_argument("--keep", type=Path, default=None, help="write the arguments of each failing case here")
    args = ap.parse_args(argv)
    t0 = time.time()
    tallies = fuzz(args.target or list(TARGETS), args.cases, args.seed, args.first, args.keep, progress=True)
    bad = 0
    for target, t in tallies.items():
        print(f"{target:14} {t.cases} cases, exit codes {dict(sorted(t.exit_codes.items()))}, "
              f"{len(t.failures)} failures, slowest {t.slowest:.1f} s")
        for f in t.failures[:20]:
            print(f"    {f}")
        bad += len(t.failures)
    print(f"peak memory {peak_rss_mib():.0f} MiB, {time.time() - t0:.0f} s")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
