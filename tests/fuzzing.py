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


_STORE_TEMPLATE: dict[str, bytes] | None = None


def _store_template() -> dict[str, bytes]:
    """A run folder with a store that holds every kind of row the probe and the watchdog write."""
    global _STORE_TEMPLATE
    if _STORE_TEMPLATE is None:
        from trainguard.store.status import write_status
        from trainguard.store.writer import StoreWriter

        with tempfile.TemporaryDirectory() as d:
            w = StoreWriter(d)
            w.set_meta("plan", {"total_steps": 60, "grad_accum": 1})
            w.set_meta("command", ["python", "train.py"])
            w.set_meta("flightrec.0", {"step": 30, "attempt": 0, "t": 1e9 + 30, "request": 1e9})
            w.set_heartbeat(t_progress=1e9 + 50, micro=50, step=50, phase="train", state="running")
            for step in range(1, 51):
                w.add_step({"step": step, "t": 1e9 + step, "loss": 3.0 / step, "lr": 1e-4 * (1 - step / 60),
                            "grad_norm": 1.0, "step_time": 0.1, "data_wait": 0.01, "parts": {"ce": 2.0, "kd": 1.0},
                            "weights": {"ce": 1.0, "kd": 0.5}})
            w.add_event("run", "start", {"pid": 1, "command": ["python", "train.py"], "attempt": 0}, step=0)
            w.add_event("phase", "eval", {"edge": "begin"}, step=20)
            w.add_event("phase", "eval", {"edge": "end"}, step=20)
            w.add_event("eval", "val", {"loss": 2.0, "metrics": {"acc": 0.5}}, step=20)
            w.add_event("checkpoint", "save", {"path": "ckpt/step-40.pt", "seconds": 1.0}, step=40)
            w.add_event("finding", "TG301", {"code": "TG301", "name": "nonfinite-loss", "severity": "error", "step": 45,
                                             "summary": "loss is NaN", "evidence": {"loss": "nan"}, "fix": "x"}, step=45)
            w.add_event("crash", "ValueError", {"exception": "ValueError", "message": "boom",
                                                "frames": [{"file": "train.py", "line": 3, "function": "f"}]}, step=50)
            w.add_event("probe", "finish", {}, step=50)
            w.close()
            write_status(d, {"state": "crashed", "step": 50, "pid": 1, "exit_code": 1, "findings": [
                {"code": "TG501", "name": "run-crashed", "severity": "error", "step": 50, "summary": "ValueError",
                 "evidence": {}, "fix": "x", "where": "train.py:3 (f)"}]})
            (Path(d) / "output.log").write_bytes(b"".join(b"step %d loss %.3f\n" % (i, 3.0 / i) for i in range(1, 51)))
            _STORE_TEMPLATE = {p.name: p.read_bytes() for p in Path(d).iterdir() if p.is_file()}
    return _STORE_TEMPLATE


def _hostile_value(rng: random.Random) -> Any:
    """A value of the wrong type, range or size for whatever column or field it lands in."""
    return rng.choice([
        None, "", "x", "nan", "inf", "-inf", 2**63 - 1, -2**63, "1" * 30, 1e308, -1e308, 0, -1, 3.5, True,
        b"\xff\xfe\x00", b"", "[1, 2]", '{"a": [1, {"b": null}]}', "[]", "{}", "null", "true", '"text"',
        _garbage(rng, 30), "9" * 5000, "[" * 3000, '{"code": 1, "name": [], "severity": "nope"}',
        '[{"code": "TG1", "name": "x", "severity": "error", "summary": "s"}]', "1e999",
        json.dumps({"step": "x", "t": [], "attempt": {}, "edge": 5, "path": 7, "frames": "no", "loss": "nan"}),
        json.dumps({"frames": [1, None, {"file": 3, "line": "x"}], "exception": 5, "message": ["m"]}),
        json.dumps({"total_steps": -5, "grad_accum": "x"}), json.dumps({"total_steps": 10**40}),
    ])


_STORE_COLUMNS = {
    "steps": ("attempt", "rank", "step", "t", "micro", "loss", "lr", "grad_norm", "update_ratio", "nonfinite",
              "step_time", "data_wait", "loss_scale", "sched_epoch", "parts", "weights", "extra"),
    "events": ("t", "attempt", "rank", "pid", "step", "kind", "name", "data"),
    "meta": ("value",),
    "heartbeat": ("rank", "attempt", "t_progress", "t_flush", "micro", "step", "phase", "state"),
}


def gen_run_store(rng: random.Random, folder: Path) -> list[str]:
    """A run folder whose store is valid SQLite holding damaged rows: wrong types, out-of-range numbers,
    JSON of the wrong shape, duplicated and missing rows (what a bit flip, a hand edit or a planted
    store gives; the readers must take each row as untrusted input)."""
    import sqlite3

    run = folder / "run"
    run.mkdir()
    for name, data in _store_template().items():
        if not name.endswith(("-wal", "-shm")):
            (run / name).write_bytes(data)
    conn = sqlite3.connect(run / "run.db")
    try:
        conn.execute("PRAGMA journal_mode=DELETE")
        for _ in range(rng.randint(1, 12)):
            table = rng.choice(list(_STORE_COLUMNS))
            col = rng.choice(_STORE_COLUMNS[table])
            op = rng.random()
            # the store's NOT NULL columns take any type (SQLite is dynamically typed), so anything goes in
            value = _hostile_value(rng)
            try:
                if op < 0.6:
                    ids = [r[0] for r in conn.execute(f"SELECT rowid FROM {table}")]
                    if ids:
                        conn.execute(f"UPDATE {table} SET {col} = ? WHERE rowid = ?", (value, rng.choice(ids)))
                elif op < 0.75:
                    conn.execute(f"UPDATE {table} SET {col} = ?", (value,))
                elif op < 0.85 and table == "steps":
                    conn.execute("INSERT INTO steps SELECT * FROM steps")  # every step twice
                elif op < 0.92:
                    conn.execute(f"DELETE FROM {table} WHERE rowid % ? = 0", (rng.randint(2, 5),))
                elif table == "events":
                    conn.execute("INSERT INTO events (t, attempt, rank, pid, step, kind, name, data) "
                                 "VALUES (?, 0, 0, 1, ?, ?, ?, ?)",
                                 (_hostile_value(rng), _hostile_value(rng),
                                  rng.choice(["finding", "crash", "phase", "eval", "checkpoint", "run", "probe",
                                              "restart", "output", "stall"]), rng.choice(["x", None, "finish", "start"]),
                                  _hostile_value(rng)))
                else:
                    conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
                                 (rng.choice(["plan", "command", "flightrec.0", "flightrec.x", "label", "config"]),
                                  _hostile_value(rng)))
            except (sqlite3.Error, OverflowError):
                continue
        conn.commit()
    finally:
        conn.close()
    if rng.random() < 0.15:
        (run / "status.json").write_bytes(json.dumps({"state": rng.choice(["completed", "running", "crashed", 5]),
                                                      "findings": rng.choice([[[1, 2]], ["x"], [{"code": 1}],
                                                                              {"a": 1}, None])}).encode())
    command = rng.choice([["status", str(run)], ["status", str(run), "--json"], ["diagnose", str(run)],
                          ["report", str(run)], ["compare", str(run), str(run), "--out", str(folder / "cmp")]])
    return command


_CACHE_TEMPLATE: dict[str, bytes] | None = None


def _cache_template() -> dict[str, bytes]:
    """A small format-2 teacher cache written the way cache_build writes one (manifest + .npz shards)."""
    global _CACHE_TEMPLATE
    if _CACHE_TEMPLATE is None:
        import io

        import numpy as np

        rng = np.random.default_rng(0)
        k, sw, n_windows, width = 4, 3, 7, 50
        manifest = {"format": 2, "k": k, "temperature": 1.0, "window_chars": 64, "text_sha256": "0" * 64,
                    "n_windows": n_windows, "shard_windows": sw, "teacher_fingerprint": 1.5, "teacher_width": width,
                    "teacher_tokenizer": "{}", "precision": "fp32", "positions": 70,
                    "partial": {"student_tokenizer_sha256": "1" * 64, "kd_positions": "all", "max_ids": 8,
                                "rows": 6, "entries": 12}}
        out = {"manifest.json": json.dumps(manifest).encode()}
        for i in range(-(-n_windows // sw)):
            w = min(sw, n_windows - i * sw)
            rows = rng.integers(5, 12, size=w)
            total = int(rows.sum())
            p_rows = rng.integers(0, 3, size=w)
            p_lens = rng.integers(1, 4, size=int(p_rows.sum()))
            arrays = {"offsets": np.concatenate([[0], np.cumsum(rows)]).astype(np.int64),
                      "ids": rng.integers(0, width, size=(total, k)).astype(np.uint32),
                      "q": rng.integers(0, 100, size=(total, k)).astype(np.uint16),
                      "nll": rng.random(w).astype(np.float32),
                      "p_offsets": np.concatenate([[0], np.cumsum(p_rows)]).astype(np.int64),
                      "p_pos": rng.integers(0, 20, size=int(p_rows.sum())).astype(np.int32),
                      "p_len": p_lens.astype(np.int64),
                      "p_ids": rng.integers(0, width, size=int(p_lens.sum())).astype(np.uint32),
                      "p_q": rng.integers(0, 5000, size=int(p_lens.sum())).astype(np.uint16)}
            buf = io.BytesIO()
            np.savez_compressed(buf, **arrays)
            out[f"shard-{i:05d}.npz"] = buf.getvalue()
        _CACHE_TEMPLATE = out
    return _CACHE_TEMPLATE


def _damaged_manifest(rng: random.Random, raw: bytes) -> bytes:
    m = json.loads(raw)
    roll = rng.random()
    if roll < 0.5:
        for _ in range(rng.randint(1, 3)):
            key = rng.choice(["format", "k", "n_windows", "shard_windows", "temperature", "positions",
                              "teacher_width", "partial", "text_sha256", "teacher_fingerprint", "window_chars"])
            value = rng.choice([_hostile_value(rng), 10**12, 2**62, 10**18, -3, 0, 1, 1.0, [], {}, "2",
                                {"rows": "x"}, {"student_tokenizer_sha256": 5}])
            m[key] = value.decode("latin-1") if isinstance(value, bytes) else value  # (JSON holds no bytes)
            if rng.random() < 0.2:
                m.pop(key, None)
        return json.dumps(m).encode()
    if roll < 0.6:
        return b"\xff\xfe" + raw[:50]  # not UTF-8
    if roll < 0.7:
        return rng.choice([b"[]", b"null", b"7", _deep_json(rng).encode(), b'{"format": ' + _big_int(rng).encode() + b"}"])
    return _mutate(raw, rng)


_BOMBS: dict[int, bytes] = {}  # made once per process: deflating 2.5 GB of zeros takes seconds


def _damaged_shard(rng: random.Random, raw: bytes, bombs_only: bool = False) -> bytes:
    import io
    import zipfile

    import numpy as np

    if bombs_only:
        for blocks in (1, 40):
            _bomb(blocks, io, zipfile)
        return b""
    return _damaged_shard_one(rng, raw, io, zipfile, np)


def _damaged_shard_one(rng: random.Random, raw: bytes, io: Any, zipfile: Any, np: Any) -> bytes:
    roll = rng.random()
    if roll < 0.5:
        with np.load(io.BytesIO(raw)) as z:
            arrays = {key: z[key] for key in z.files}
        for _ in range(rng.randint(1, 3)):
            key = rng.choice(sorted(arrays))
            a = arrays[key]
            if a.dtype.kind not in "iuf":
                continue  # already replaced by text: damaged enough
            arrays[key] = rng.choice([
                a[: max(0, len(a) - rng.randint(1, 3))], np.concatenate([a, a]), a.astype(np.float64),
                a.reshape(-1) if a.ndim > 1 else a.reshape(-1, 1), np.array([], dtype=a.dtype),
                np.full_like(a, -1) if a.dtype.kind == "i" else np.full_like(a, 2**31 - 1 if a.dtype.itemsize >= 4 else 65535),
                a[::-1].copy(), np.array(["x"] * max(1, len(a))), np.zeros((2, 2, 2), dtype=np.int64)])
            if rng.random() < 0.15:
                arrays.pop(key)
        buf = io.BytesIO()
        np.savez_compressed(buf, **arrays)
        return buf.getvalue()
    if roll < 0.6:  # a zip bomb: a member that inflates to far more than a shard holds
        return _bomb(rng.choice([1, 40]), io, zipfile)
    if roll < 0.7:
        return _mutate(raw, rng)[: rng.randint(0, len(raw))]
    return _mutate(raw, rng)


def _bomb(blocks: int, io: Any, zipfile: Any) -> bytes:
    """An .npz whose `ids` claims 12.8 GB and inflates to `blocks` x 64 MiB of zeros (made once)."""
    if blocks not in _BOMBS:
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
            with z.open("ids.npy", "w", force_zip64=True) as f:
                header = b"\x93NUMPY\x01\x00v\x00{'descr': '<u4', 'fortran_order': False, 'shape': (800000000, 4), }"
                f.write(header.ljust(127, b" ") + b"\n")
                for _ in range(blocks):
                    f.write(b"\0" * (1 << 26))
        _BOMBS[blocks] = buf.getvalue()
    return _BOMBS[blocks]


def gen_cache(rng: random.Random, folder: Path) -> list[str]:
    """A teacher cache folder (distill), its manifest or shards damaged, or special files in their place."""
    cache = folder / "cache"
    cache.mkdir()
    files = _cache_template()
    target = rng.choice(sorted(files))
    for name, data in files.items():
        if name == target:
            roll = rng.random()
            if roll < 0.08:
                continue  # missing
            if roll < 0.16:
                kind = rng.choice(["fifo", "zero", "link", "dir"])
                if kind == "fifo":
                    os.mkfifo(cache / name)
                elif kind == "zero":
                    (cache / name).symlink_to("/dev/zero")
                elif kind == "link":
                    outside = folder / "outside.bin"
                    outside.write_bytes(data)
                    (cache / name).symlink_to(outside)
                else:
                    (cache / name).mkdir()
                continue
            data = _damaged_manifest(rng, data) if name == "manifest.json" else _damaged_shard(rng, data)
        (cache / name).write_bytes(data)
    return ["distill", "cache", "info", str(cache)]


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


# ---------------------------------------------------------------------------------------------------------
# the campaign of issue 32 for the readers of other tools' files: every printed family, every table, every
# plan or config file, each written from its writer's contract (the sample lines and file names declared in
# trainguard/ingest/formats/) and then damaged


_PLACEHOLDER = re.compile(r"\{\{|\}\}|\{(\w+)(?::[^{}]*)?\}")
_ENCODINGS = ["utf-8", "utf-8", "utf-8", "utf-8-sig", "utf-16", "latin-1", "cp1252"]


def _render(sample: str, values: dict[str, str]) -> str:
    """A sample line with every field filled by text (format specs dropped: a hostile value is no int)."""
    def one(m: re.Match[str]) -> str:
        return "{" if m.group() == "{{" else "}" if m.group() == "}}" else values.get(m.group(1) or "", "0")
    return _PLACEHOLDER.sub(one, sample)


def _hostile_step(rng: random.Random, step: int) -> str:
    return rng.choice([str(step)] * 8 + [_big_int(rng), str(-step), "nan", f"{step}.5", ""])


def _encode(text: str, rng: random.Random) -> bytes:
    """The text as some writer's locale or a Windows console would store it; a character the encoding
    lacks is replaced (the writer's own `errors=`), a lone surrogate kept as its bytes."""
    encoding = rng.choice(_ENCODINGS)
    if encoding.startswith("utf-8"):
        return text.encode(encoding, "surrogatepass")
    return text.encode(encoding, "replace")


def _text_rules() -> list[Any]:
    from trainguard.ingest.formats._text import text_rules

    return sorted(text_rules(), key=lambda r: r.format)


def gen_textlog_family(rng: random.Random, folder: Path) -> list[str]:
    """A console log of one printed family (cycled by case index through the contracts' sample lines), its
    values hostile now and then, varied the ways real logs vary, then damaged."""
    rules = rng.choice(_text_rules())
    lines: list[str] = []
    if rng.random() < 0.3:  # a config dump printed first: the plan keys the contract reads
        for key in rules.plan_steps + rules.plan_epochs + rules.batch_size:
            lines.append(f"{key}{rng.choice([': ', '=', ' = '])}{_number(rng)}")
    prefix = rng.choice(["", "", "[rank0]: ", "2026-01-01 12:00:00,123 - INFO - ", "\x1b[32m", "[default1]:"])
    total = rng.choice([60, 0, 10**6, -1])
    steps = rng.randint(0, 150)
    step = 0
    for _ in range(steps):
        step += rng.choice([1, 1, 1, 0, -3, 1000])
        epoch, batch = divmod(max(step, 0), 20)
        hostile = rng.random() < 0.2
        values = {"step": _hostile_step(rng, step) if hostile else str(step), "total": str(total),
                  "epoch": str(epoch + 1), "epochs": _number(rng) if hostile else "4", "batch": str(batch),
                  "batches": "20", "pct": "50", "samples": str(batch * 64), "size": "1280",
                  "loss": _number(rng) if hostile else f"{3.0 / (1 + step % 97):.4f}",
                  "val": _number(rng) if hostile else "2.1000"}
        for sample in rules.sample:
            line = prefix + _render(sample, values)
            if rng.random() < 0.05:
                line = line.replace(" ", rng.choice(["\t", "  ", "\r", ""]))
            lines.append(line)
        if rng.random() < 0.02:  # a relaunch appended: the steps start over
            step = 0
    if rng.random() < 0.05:  # an enormous line, somewhere
        lines.insert(rng.randint(0, len(lines)), "x" * rng.choice([70_000, 3_000_000]) + f" loss {_number(rng)}")
    if rules.completion and rng.random() < 0.3:
        lines.append(rng.choice(rules.completion).replace("\\", "").replace("d+", "12"))
    if rng.random() < 0.15:
        lines += _failure_tail(rng)
    end = rng.choice(["\n", "\n", "\r\n", "\r"])
    data = _mutate(_encode(end.join(lines), rng), rng) if rng.random() < 0.7 else _encode(end.join(lines), rng)
    path = folder / rng.choice(["train.log", "output.log", "stdout.txt", "slurm-123.out", "log.txt"])
    if rng.random() < 0.05:
        real = folder / "real.log"
        real.write_bytes(data)
        path.symlink_to(real)  # a link the user named: read through it, bounded like any file
    else:
        path.write_bytes(data)
    return ["diagnose", str(path)] + (["--json"] if rng.random() < 0.3 else [])


def _failure_tail(rng: random.Random) -> list[str]:
    """The end of a multi-process run as torchrun prints it, its fields hostile now and then."""
    rank = rng.choice(["0", "1", "7", "-1", _big_int(rng), "x"])
    code = rng.choice(["-9", "1", "-6", "137", "-15", "", _big_int(rng)])
    out = [f"[rank{rng.randint(0, 3)}]: RuntimeError: Connection reset by peer",
           f"E1206 07:32:01.672000 5185 api.py:1002] failed (exitcode: {code}) local_rank: {rank} (pid: 5)"]
    out += ["=" * 54, "train.py FAILED", "-" * 54, "Failures:", rng.choice(["  <NO_OTHER_FAILURES>", "[1]:"]),
            "-" * 54, "Root Cause (first observed failure):", "[0]:",
            f"  time      : {rng.choice(['2026-12-06_07:32:01', '', _garbage(rng)])}",
            f"  rank      : {rank} (local_rank: {rank})", f"  exitcode  : {code} (pid: {_number(rng)})",
            f"  traceback : Signal {code.lstrip('-')} (SIGKILL) received by PID 5", "=" * 54]
    return out[:rng.randint(1, len(out))]


# the tables other tools write, by their writers' columns (docs of ultralytics, yolov5, Keras CSVLogger,
# Lightning's CSVLogger, timm's train.py): (file name, columns, plan file, epoch base)
_TABLES: dict[str, tuple[str, list[str], str | None]] = {
    "ultralytics": ("results.csv", ["epoch", "time", "train/box_loss", "train/cls_loss", "train/dfl_loss",
                                    "metrics/precision(B)", "metrics/recall(B)", "metrics/mAP50(B)",
                                    "metrics/mAP50-95(B)", "val/box_loss", "val/cls_loss", "val/dfl_loss", "lr/pg0",
                                    "lr/pg1", "lr/pg2"], "args.yaml"),
    "yolov5": ("results.csv", ["               epoch", "      train/box_loss", "      train/obj_loss",
                               "      train/cls_loss", "   metrics/precision", "      metrics/recall",
                               "     metrics/mAP_0.5", "metrics/mAP_0.5:0.95", "        val/box_loss",
                               "        val/obj_loss", "        val/cls_loss", "               x/lr0",
                               "               x/lr1", "               x/lr2"], "opt.yaml"),
    "keras": ("training.csv", ["epoch", "accuracy", "learning_rate", "loss", "val_accuracy", "val_loss"], None),
    "lightning": ("lightning_logs/version_0/metrics.csv", ["epoch", "step", "train_loss", "train_loss_step",
                                                           "train_loss_epoch", "val_loss", "val_acc", "lr-AdamW"],
                  "lightning_logs/version_0/hparams.yaml"),
    "timm": ("summary.csv", ["epoch", "train_loss", "eval_loss", "eval_top1", "eval_top5", "lr"], "args.yaml"),
}


def _cell(rng: random.Random, good: float) -> str:
    return f"{good:.5g}" if rng.random() < 0.85 else rng.choice([_number(rng), "", '"1,2"', _garbage(rng, 8)])


def gen_table(rng: random.Random, folder: Path) -> list[str]:
    """A metrics table of one writer (cycled by case index) with its plan file beside it, rows hostile now and
    then (huge numbers, NaN/inf text, ragged rows, a quoted newline), then damaged."""
    kind = rng.choice(sorted(_TABLES))
    name, columns, plan = _TABLES[kind]
    cols = list(columns)
    if rng.random() < 0.1:
        cols = rng.sample(cols, rng.randint(0, len(cols))) + [_garbage(rng, 12)]
    rows = [",".join(cols)]
    epochs = rng.choice([10, 300, 0, 1])
    for i in range(rng.randint(0, 300)):
        row = [str(i if rng.random() < 0.95 else rng.choice([_big_int(rng), -i, "nan", "1e309"]))]
        row += [_cell(rng, 2.0 / (i + 1)) for _ in cols[1:]]
        if rng.random() < 0.03:
            row = row[:rng.randint(0, len(row))] if rng.random() < 0.5 else row * 3  # ragged
        if rng.random() < 0.01:
            row.append('"a\nb"')
        rows.append(",".join(row))
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "\n".join(rows) + rng.choice(["\n", "", "\r\n"])
    data = _encode(text, rng) if rng.random() < 0.2 else text.encode("utf-8", "surrogatepass")
    path.write_bytes(_mutate(data, rng) if rng.random() < 0.5 else data)
    if plan is not None and rng.random() < 0.8:
        _write_plan(rng, folder / plan, {"epochs": epochs, "patience": rng.choice([50, 0, 3]),
                                         "max_epochs": epochs, "lr0": 0.01, "lrf": 0.01})
    target = rng.choice([path, folder, path.parent])
    return ["diagnose", str(target)] + (["--json"] if rng.random() < 0.3 else [])


def _hostile_yaml(rng: random.Random, values: dict[str, Any]) -> str:
    """A plan or config file: its writer's YAML (yaml.safe_dump of a dict), or what a hostile hand makes."""
    import yaml

    roll = rng.random()
    if roll < 0.5:
        return yaml.safe_dump({k: rng.choice([v, v, _number(rng), None, [v], {"value": v}, "x" * 100])
                               for k, v in values.items()})
    if roll < 0.58:
        return _alias_bomb(rng.randint(3, 12))
    if roll < 0.64:
        return "epochs: " + "[" * rng.choice([100, 3000, 50_000]) + "\n"
    if roll < 0.7:
        return f"epochs: {_big_int(rng)}\npatience: !!int {_big_int(rng)}\n"
    if roll < 0.74:
        return "epochs: !!python/object/apply:os.system ['echo hi']\n"
    if roll < 0.8:
        return "epochs: &x [*x]\n" if rng.random() < 0.5 else "a: &x {b: *x}\nepochs: 1\n"
    if roll < 0.86:
        return "epochs:\n  value: " + rng.choice(["1e999", "-.inf", ".nan", "0x10", "0o7", "1_000", "'10'"]) + "\n"
    if roll < 0.9:
        return "- " * rng.randint(1, 5000) + "epochs\n"
    return _garbage(rng, 400)


def _write_plan(rng: random.Random, path: Path, values: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    roll = rng.random()
    if roll < 0.04:
        os.mkfifo(path)
    elif roll < 0.07:
        path.symlink_to("/dev/zero")
    elif roll < 0.09:
        path.mkdir()
    elif roll < 0.11:
        path.write_bytes(b"epochs: 10\n" + b"#" * (2 << 20))  # past any plan file's cap
    else:
        text = _hostile_yaml(rng, values)
        path.write_bytes(_mutate(_encode(text, rng), rng) if rng.random() < 0.4 else _encode(text, rng))


_PYCONFIG = ["max_epochs = {n}", "train_cfg = dict(type='EpochBasedTrainLoop', max_epochs={n}, val_interval=1)",
             "train_cfg = dict(by_epoch=False, max_iters={n})", "import os\nos.system('echo hi')",
             "max_epochs = __import__('os').getpid()", "x = " + "(" * 500 + "1" + ")" * 500,
             "x = dict(" * 200 + ")" * 200, "max_epochs = {n} ** {n} ** {n}", "max_epochs = '1' * 10**9",
             "def f():\n    return 1\nmax_epochs = f()", "lambda: (yield)"]


def gen_plan_config(rng: random.Random, folder: Path) -> list[str]:
    """The plan and config files read beside metrics (Ultralytics args.yaml, YOLOv5 opt.yaml, Lightning
    hparams.yaml, timm args.yaml, W&B files/config.yaml, an OpenMMLab config.py, Hugging Face
    trainer_state.json) hostile, beside a table or log that is sound: the reader of the plan is what is fuzzed."""
    kind = rng.choice(["ultralytics", "yolov5", "lightning", "timm", "wandb", "mmengine", "trainer_state"])
    n = rng.choice(["10", "0", "-1", _big_int(rng), "1e309", "nan"])
    if kind in _TABLES:
        name, columns, plan = _TABLES[kind]
        rows = [",".join(columns)] + [",".join([str(i)] + [f"{2.0 / (i + 1):.5g}"] * (len(columns) - 1))
                                      for i in range(rng.randint(1, 40))]
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text("\n".join(rows) + "\n")
        assert plan is not None
        _write_plan(rng, folder / plan, {"epochs": n, "patience": n, "max_epochs": n})
        if kind == "yolov5" and rng.random() < 0.5:
            _write_plan(rng, folder / "hyp.yaml", {"lr0": n, "lrf": n, "warmup_epochs": n})
        target = rng.choice([folder, folder / name])
    elif kind == "wandb":
        files = folder / "wandb" / "run-20260101_000000-abc" / "files"
        files.mkdir(parents=True)
        (files / "wandb-summary.json").write_text(json.dumps({"_step": 99, "train_loss": 0.5, "epoch": 3}))
        (files / "output.log").write_text("\n".join(f"step {i} loss {2.0 / (i + 1):.4f}" for i in range(50)) + "\n")
        _write_plan(rng, files / "config.yaml", {"epochs": {"desc": None, "value": n}, "num_epochs": n})
        target = rng.choice([files.parent, files / "output.log"])
    elif kind == "mmengine":
        vis = folder / "20260101_000000" / "vis_data"
        vis.mkdir(parents=True)
        (vis / "scalars.json").write_text("\n".join(json.dumps({"lr": 0.01, "loss": 2.0 / i, "iter": i * 10, "epoch": 1,
                                                                "step": i * 10}) for i in range(1, 40)) + "\n")
        text = rng.choice(_PYCONFIG).format(n=n) if rng.random() < 0.7 else _garbage(rng, 300)
        cfg = vis / "config.py"
        if rng.random() < 0.1:
            os.mkfifo(cfg)
        else:
            cfg.write_bytes(_mutate(_encode(text, rng), rng) if rng.random() < 0.4 else _encode(text, rng))
        target = rng.choice([vis.parent, vis, vis / "scalars.json"])
    else:
        return gen_trainer_state(rng, folder)
    return ["diagnose", str(target)] + (["--json"] if rng.random() < 0.3 else [])


_JSONL_NAMES = ["metrics.jsonl", "log.ndjson", "metrics.json", "trainer_log.jsonl", "logging.jsonl",
                "vis_data/scalars.json", "files/wandb-history.jsonl"]


def gen_jsonlines(rng: random.Random, folder: Path) -> list[str]:
    """JSON Lines of each writer (detectron2 metrics.json, mmengine scalars.json, LLaMA-Factory
    trainer_log.jsonl, ms-swift logging.jsonl, any jsonl): records of the writer's keys, hostile now and then
    (wrong types, deep nesting, huge numbers, NaN/Infinity literals, a record of megabytes)."""
    name = rng.choice(_JSONL_NAMES)
    keys = {"metrics.json": ["iteration", "total_loss", "lr", "loss_cls"],
            "vis_data/scalars.json": ["iter", "step", "epoch", "loss", "lr"],
            "trainer_log.jsonl": ["current_steps", "total_steps", "loss", "lr", "epoch"],
            "logging.jsonl": ["global_step/max_steps", "loss", "learning_rate", "epoch"]}.get(name, ["step", "loss", "lr"])
    lines = []
    for i in range(rng.randint(0, 300)):
        roll = rng.random()
        if roll < 0.03:
            lines.append(_deep_json(rng))
        elif roll < 0.06:
            lines.append("{" + ", ".join(f'"{k}": {_big_int(rng)}' for k in keys) + "}")
        elif roll < 0.09:
            lines.append("{" + ", ".join(f'"{k}": {rng.choice(["NaN", "Infinity", "-Infinity", "1e999"])}'
                                         for k in keys) + "}")
        elif roll < 0.1:
            lines.append(json.dumps({keys[0]: i, "blob": "x" * rng.choice([100_000, 3_000_000])}))
        else:
            rec: dict[str, Any] = {}
            for k in keys:
                rec[k] = (i if k in ("iteration", "iter", "step", "current_steps") else 2.0 / (i + 1)) \
                    if rng.random() < 0.9 else rng.choice([None, "x", [1], {"a": 1}, True, -1, f"{i}/100"])
            lines.append(json.dumps(rec))
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "\n".join(lines) + "\n"
    path.write_bytes(_mutate(_encode(text, rng), rng) if rng.random() < 0.6 else _encode(text, rng))
    return ["diagnose", str(rng.choice([path, path.parent]))] + (["--json"] if rng.random() < 0.3 else [])


_SCHEDULER_ENDS = ["slurmstepd: error: *** JOB 4242 ON node7 CANCELLED AT 2026-01-01T00:00:00 DUE TO TIME LIMIT ***",
                   "slurmstepd: error: Detected 1 oom_kill event in StepId=4242.0. Some of the step tasks have been "
                   "OOM Killed.", "TERM_RUNLIMIT: job killed after reaching LSF run time limit.",
                   "Traceback (most recent call last):\n  File \"train.py\", line 9, in <module>\nRuntimeError: boom",
                   "Killed", ""]


def _one_run(rng: random.Random, run: Path) -> None:
    """One run's folder as one of the writers leaves it: a YOLO folder (results.csv / results.txt, or only its
    args.yaml / opt.yaml), TensorBoard event files, a LeRobot console; the scheduler's files beside it now
    and then; every file damaged now and then."""
    run.mkdir(parents=True, exist_ok=True)
    kind = rng.choice(["ultralytics", "yolov5", "yolov7", "tensorboard", "lerobot"])
    epochs = rng.choice([3, 300, 0, -1])
    files: dict[str, bytes] = {}
    if kind in ("ultralytics", "yolov5", "yolov7"):
        plan = "args.yaml" if kind == "ultralytics" else "opt.yaml"
        files[plan] = f"epochs: {_number(rng) if rng.random() < 0.2 else epochs}\npatience: 100\n".encode()
        if rng.random() < 0.7 and kind == "yolov7":
            rows = [f"{e}/{epochs - 1}  6.1G  0.05  0.02  0.01  0.08  12  640  0.5  0.4  {_cell(rng, 0.3)}  0.2  "
                    f"0.04  0.01  0.005" for e in range(rng.randint(0, 40))]
            files["results.txt"] = "\n".join(rows).encode()
        elif rng.random() < 0.7:
            head = "epoch,train/box_loss,train/cls_loss,metrics/mAP50(B),val/box_loss,lr/pg0"
            rows = [head] + [f"{e},{_cell(rng, 0.1)},{_cell(rng, 0.05)},{_cell(rng, 0.3)},0.08,0.001"
                             for e in range(rng.randint(0, 40))]
            files["results.csv"] = "\n".join(rows).encode()
        if rng.random() < 0.3:
            (run / "weights").mkdir(exist_ok=True)
            if rng.random() < 0.5:
                (run / "weights" / "last.pt").write_bytes(_garbage(rng).encode("utf-8", "surrogatepass"))
    elif kind == "tensorboard":
        for i in range(rng.randint(1, 3)):
            files[f"events.out.tfevents.{1000 + i}.host.{i}"] = _tb_template()
    else:
        lines = [f"INFO 2026-01-01 00:00:00 ts/train.py:200 step:{k}K smpl:{32 * k}K ep:{k} epch:0.{k} "
                 f"loss:{_cell(rng, 0.5)} grdn:1.2 lr:1.0e-04 updt_s:0.1 data_s:0.0" for k in range(rng.randint(0, 30))]
        files["train.log"] = _encode("\n".join(lines), rng) if rng.random() < 0.3 else "\n".join(lines).encode()
    if rng.random() < 0.4:
        files[f"slurm-{rng.randint(1, 10**6)}.out"] = ("step 1 loss 2.0\n" + rng.choice(_SCHEDULER_ENDS)).encode()
        if rng.random() < 0.5:
            files[f"slurm-{rng.randint(1, 10**6)}.err"] = rng.choice(_SCHEDULER_ENDS).encode()
    for name, data in files.items():
        (run / name).write_bytes(_mutate(data, rng) if rng.random() < 0.4 else data)


def gen_run_folders(rng: random.Random, folder: Path) -> list[str]:
    """A parent folder of several runs (`runs/exp`, `exp2`, `lightning_logs/version_N`-like), or one run, as
    the writers leave them; a link now and then that points out of the folder (never followed) or at a FIFO."""
    top = folder / "runs"
    names = rng.sample(["exp", "exp2", "train", "train2", "version_0", "version_1", "detect/train"], rng.randint(1, 4))
    for name in names:
        _one_run(rng, top / name)
    if rng.random() < 0.1:
        outside = folder / "outside"
        outside.mkdir()
        (outside / "results.csv").write_text("epoch,train/box_loss\n0,1.0\n")
        (top / "linked").symlink_to(outside)
        (top / names[0] / "slurm-9.out").unlink(missing_ok=True)
        (top / names[0] / "slurm-9.out").symlink_to(outside / "results.csv")
    if rng.random() < 0.05:
        os.mkfifo(top / names[-1] / "slurm-77.err")
    target = rng.choice([top, top / names[0], folder])
    return ["diagnose", str(target)] + (["--json"] if rng.random() < 0.3 else [])


TARGETS: dict[str, Callable[[random.Random, Path], list[str]]] = {
    "textlog": gen_textlog, "csv": gen_csv, "jsonl": gen_jsonl, "trainer_state": gen_trainer_state,
    "tensorboard": gen_tensorboard, "run_folder": gen_run_folder, "check": gen_check, "special": gen_special,
    "run_store": gen_run_store, "cache": gen_cache, "textlog_family": gen_textlog_family, "table": gen_table,
    "plan_config": gen_plan_config, "jsonlines": gen_jsonlines, "run_folders": gen_run_folders,
}


# ---------------------------------------------------------------------------------------------------------
# the harness


@dataclass
class Tally:
    cases: int = 0
    exit_codes: dict[int, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    slowest: float = 0.0
    peak_grew: int = 0
    """The most one isolated case's resident memory grew (bytes, from VmHWM)."""
    seconds: float = 0.0

    def ok(self) -> bool:
        return not self.failures

    def kinds(self) -> dict[str, int]:
        """Failures by kind: exit 70, traceback, timeout (a hang), memory (past the cap), other."""
        out = {"exit 70": 0, "traceback": 0, "timeout": 0, "memory": 0, "other": 0}
        for f in self.failures:
            what = f.split(": ", 1)[1] if ": " in f else f
            key = ("exit 70" if what.startswith("exit 70") else "traceback" if "traceback" in what
                   else "timeout" if what.startswith(("timeout", "hang")) else "memory" if "memory" in what.lower()
                   else "other")
            out[key] += 1
        return out


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


_WARM: set[str] = set()
WARM_CASES = 12  # cases run in the harness itself before the forked ones: enough to meet every format of a target
ISOLATED_TIMEOUT = 20  # seconds a case may take in its own process before it counts as a hang
ISOLATED_MEMORY = 2 << 30  # bytes of address space a case may add to what the harness already maps


def run_case_isolated(target: str, seed: int, index: int, keep: Path | None = None,
                      timeout: float = ISOLATED_TIMEOUT, memory: int = ISOLATED_MEMORY
                      ) -> tuple[int | None, str | None, float]:
    """`run_case` in a forked child under a memory cap (RLIMIT_AS) and a wall-clock limit: a reader that
    allocates without bound dies of MemoryError there (a failure, reported), not on the machine; one that
    loops or blocks is killed after `timeout` seconds (a hang, reported)."""
    import select

    if target == "cache" and not _BOMBS:  # made here, once: a forked child's would die with it
        _damaged_shard(random.Random(0), b"", bombs_only=True)
    if target not in _WARM:
        # cases in this process first: the modules their commands import (torch and transformers for
        # `distill cache`, 10 s on a loaded machine; each reader's own for a target of several formats) are
        # then loaded once, not in every forked child
        _WARM.add(target)
        for warm in range(-1, -WARM_CASES - 1, -1):
            run_case(target, seed, warm)
    r, w = os.pipe()
    t0 = time.perf_counter()
    pid = os.fork()
    if pid == 0:  # the child: cap, run, report, leave without running the parent's atexit hooks
        os.close(r)
        code, failure = -1, "the case raised in the harness"
        grew = 0
        try:
            mapped = _mapped_bytes()
            resource.setrlimit(resource.RLIMIT_AS, (mapped + memory, mapped + memory))
            start = _reset_peak()
            code, failure, _ = run_case(target, seed, index, keep)
            grew = max(0, _status_kib("VmHWM") * 1024 - start)
            if isinstance(failure, str) and "MemoryError" in failure:
                failure = f"memory: past the cap of {memory >> 20} MiB ({failure})"
            elif failure is None and grew > MEMORY_LIMIT:
                failure = f"memory: the case's peak resident size grew {grew >> 20} MiB (limit {MEMORY_LIMIT >> 20} MiB)"
        except BaseException as exc:  # noqa: BLE001 - anything here is the case's failure, said in the report
            failure = f"harness: {type(exc).__name__}: {str(exc)[:200]}"
        try:
            os.write(w, json.dumps({"code": code, "failure": failure, "grew": grew}).encode())
        finally:
            os._exit(0)
    os.close(w)
    chunks = []
    deadline = time.monotonic() + timeout
    timed_out = False
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            timed_out = True
            break
        ready, _, _ = select.select([r], [], [], left)
        if ready:
            chunk = os.read(r, 65536)
            if not chunk:
                break
            chunks.append(chunk)
    os.close(r)
    if timed_out:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    seconds = time.perf_counter() - t0
    if timed_out:
        return None, f"timeout (> {timeout:.0f} s)", seconds
    try:
        answer = json.loads(b"".join(chunks))
    except ValueError:
        why = f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else f"exit {os.WEXITSTATUS(status)}"
        return None, f"the case's process died ({why}) without an answer", seconds
    _LAST_PEAK[0] = int(answer.get("grew") or 0)
    return answer["code"], answer["failure"], seconds


MEMORY_LIMIT = 1 << 30  # bytes of resident memory one case may add to what the forked child began with
_LAST_PEAK = [0]  # what the last isolated case's resident size grew by (bytes), for the tally


def _status_kib(key: str) -> int:
    """A field of /proc/self/status in KiB (VmHWM, VmRSS), 0 where it cannot be read."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def _reset_peak() -> int:
    """Resets this process's peak resident size (VmHWM) to its current one and returns that, in bytes.
    A forked child inherits its parent's resident pages and peak; ru_maxrss would also survive an exec.
    Writing 5 to clear_refs (Linux 4.0+) starts the peak again from here, so VmHWM - this is the case's."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        pass
    return _status_kib("VmRSS") * 1024


def _mapped_bytes() -> int:
    """This process's address space now (VmSize), so the cap is what a case may add to it."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 1 << 30


def _stderr_separate(result: Any) -> bool:
    try:
        return bool(result.stderr)
    except ValueError:
        return False


def fuzz(targets: list[str], cases: int, seed: int = 1, first: int = 0, keep: Path | None = None,
         progress: bool = False, isolated: bool = False) -> dict[str, Tally]:
    tallies = {}
    for target in targets:
        tally = Tally()
        for index in range(first, first + cases):
            one = run_case_isolated if isolated else run_case
            _LAST_PEAK[0] = 0
            code, failure, seconds = one(target, seed, index, keep)
            tally.cases += 1
            tally.seconds += seconds
            tally.peak_grew = max(tally.peak_grew, _LAST_PEAK[0])
            tally.exit_codes[code if code is not None else -1] = tally.exit_codes.get(code if code is not None else -1, 0) + 1
            tally.slowest = max(tally.slowest, seconds)
            if failure:
                tally.failures.append(f"{target}#{index}: {failure}")
                if progress:
                    print(f"  FAILED {target}#{index}: {failure}", file=sys.stderr, flush=True)
            if progress and tally.cases % 100 == 0:
                print(f"  {target}: {tally.cases} cases, exit codes {dict(sorted(tally.exit_codes.items()))}, "
                      f"{len(tally.failures)} failures {tally.kinds()}, slowest {tally.slowest:.1f} s, "
                      f"case peak +{tally.peak_grew >> 20} MiB, harness {peak_rss_mib():.0f} MiB",
                      file=sys.stderr, flush=True)
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
    ap.add_argument("--isolated", action="store_true",
                    help=f"each case in its own forked process, capped at {ISOLATED_MEMORY >> 20} MiB more address "
                         f"space and {ISOLATED_TIMEOUT} s")
    args = ap.parse_args(argv)
    t0 = time.time()
    tallies = fuzz(args.target or list(TARGETS), args.cases, args.seed, args.first, args.keep, progress=True,
                   isolated=args.isolated)
    bad = 0
    for target, t in tallies.items():
        print(f"{target:14} {t.cases} cases, exit codes {dict(sorted(t.exit_codes.items()))}, "
              f"{len(t.failures)} failures {t.kinds()}, slowest {t.slowest:.1f} s, {t.seconds:.0f} s in all, "
              f"largest case peak +{t.peak_grew >> 20} MiB")
        for f in t.failures[:20]:
            print(f"    {f}")
        bad += len(t.failures)
    print(f"peak memory {peak_rss_mib():.0f} MiB, {time.time() - t0:.0f} s")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
