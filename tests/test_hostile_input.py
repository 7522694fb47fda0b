"""Hostile input, one case each: one line and exit 2 (or a normal answer), never a traceback, a hang or
exit 70; what trainguard prints carries no raw control character; report.md keeps HTML inert."""

from __future__ import annotations

import os
import re
import resource
import time
from pathlib import Path

from tgtest import run_trainguard

from trainguard.store.status import write_status
from trainguard.store.writer import StoreWriter


def _one_line_exit_2(out) -> None:
    assert out.returncode == 2, (out.returncode, out.stdout, out.stderr)
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr


def test_a_fifo_is_refused_in_one_line(tmp_path: Path) -> None:
    for name, command in (("train.log", "diagnose"), ("config.yaml", "check")):
        fifo = tmp_path / name
        os.mkfifo(fifo)
        t0 = time.time()
        out = run_trainguard(command, str(fifo), timeout=30)
        _one_line_exit_2(out)
        assert "FIFO" in out.stderr and time.time() - t0 < 20
    run = tmp_path / "run"
    run.mkdir()
    os.mkfifo(run / "status.json")
    for command in (["status", str(run)], ["report", str(run)]):
        _one_line_exit_2(run_trainguard(*command, timeout=30))


def test_a_yaml_alias_bomb_is_refused_fast(tmp_path: Path) -> None:
    lines = ['a0: &a0 ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 9)]
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join(lines) + "\nlearning_rate: *a8\n")
    assert bomb.stat().st_size < 1000
    t0 = time.time()
    out = run_trainguard("check", str(bomb), timeout=60)
    _one_line_exit_2(out)
    assert "alias" in out.stderr and time.time() - t0 < 15


def test_recursive_yaml_deep_json_and_huge_integers_are_one_line(tmp_path: Path) -> None:
    cases = {
        "rec.yaml": "a: &x [*x]\nlearning_rate: 1\n",
        "deep.json": "[" * 100_000 + "]" * 100_000,
        "deep.yaml": "x: " + "[" * 50_000 + "\n",
        "big.json": '{"learning_rate": ' + "7" * 5000 + "}",
    }
    for name, text in cases.items():
        (tmp_path / name).write_text(text)
        _one_line_exit_2(run_trainguard("check", str(tmp_path / name), timeout=60))
    state = tmp_path / "hf" / "trainer_state.json"
    state.parent.mkdir()
    state.write_text('{"log_history": [], "max_steps": ' + "9" * 4400 + "}")
    _one_line_exit_2(run_trainguard("diagnose", str(state), timeout=60))
    state.write_text('{"log_history": ' + "[" * 100_000 + "]" * 100_000 + "}")
    _one_line_exit_2(run_trainguard("diagnose", str(state), timeout=60))


def test_a_damaged_run_folder_is_one_line(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    w = StoreWriter(run)
    w.add_step({"step": 1, "t": time.time(), "loss": 1.0})
    w.close()
    write_status(run, {"state": "completed", "findings": []})
    data = bytearray((run / "run.db").read_bytes())
    data[100:4000] = b"\xff" * 3900
    (run / "run.db").write_bytes(bytes(data))
    for command in (["report", str(run)], ["diagnose", str(run)]):
        out = run_trainguard(*command, timeout=60)
        assert out.returncode in (0, 1, 2) and "Traceback" not in out.stderr and "internal error" not in out.stderr
    (run / "status.json").write_text("[" * 100_000)
    _one_line_exit_2(run_trainguard("status", str(run), timeout=60))


HOSTILE = "\x1b]0;owned\x07\x1b[2J<img src=x onerror=alert(1)>"


def test_control_characters_never_reach_the_terminal_and_report_md_keeps_html_inert(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    w = StoreWriter(run)
    w.set_meta("plan", {"total_steps": 10})
    for step in range(1, 10):
        w.add_step({"step": step, "t": time.time(), "loss": 1.0 / step})
    w.add_event("phase", HOSTILE, {"edge": "begin"}, step=3)
    w.add_event("crash", "ValueError", {"exception": "ValueError", "message": HOSTILE, "phase": HOSTILE,
                                        "frames": [{"file": "train.py", "line": 3, "function": "f"}]}, step=9)
    w.close()
    finding = {"code": "TG501", "name": "run-crashed", "severity": "error", "step": 9,
               "summary": f"ValueError: {HOSTILE}", "evidence": {"message": HOSTILE}, "fix": HOSTILE, "where": HOSTILE}
    write_status(run, {"state": "crashed", "step": 9, "phase": HOSTILE, "findings": [finding]})
    for command in (["status", str(run)], ["report", str(run), "--print"], ["diagnose", str(run)],
                    ["ls", "--root", str(tmp_path)]):
        out = run_trainguard(*command, timeout=120)
        assert out.returncode in (0, 1), out.stderr
        assert "\x1b" not in out.stdout + out.stderr and "\x07" not in out.stdout + out.stderr, command
    md = (run / "report.md").read_text()
    assert "\x1b" not in md, md[max(0, md.find("\x1b") - 300):md.find("\x1b") + 50]
    assert not re.search(r"(?<!\\)<img", md)  # escaped: inert in any Markdown renderer
    log = tmp_path / "train.log"
    log.write_text(f"step 1 loss 2.0\nstep 2 loss 1.9\nTraceback (most recent call last):\n"
                   f'  File "train.py", line 3, in <module>\nValueError: {HOSTILE}\n')
    out = run_trainguard("diagnose", str(log), timeout=60)
    assert "\x1b" not in out.stdout and "ValueError" in out.stdout


def test_integers_past_any_float_and_quadratic_lines_found_by_the_fuzzers(tmp_path: Path) -> None:
    huge = "9" * 400  # an int Python reads, float() cannot
    (tmp_path / "m.jsonl").write_text("\n".join(f'{{"step": {i}, "loss": {huge if i == 3 else 1.0}}}'
                                                for i in range(1, 6)))
    out = run_trainguard("diagnose", str(tmp_path / "m.jsonl"), timeout=60)
    assert out.returncode in (0, 1) and "internal error" not in out.stderr, out.stderr
    (tmp_path / "c.json").write_text('{"learning_rate": ' + huge + "}")
    _one_line_exit_2(run_trainguard("check", str(tmp_path / "c.json"), timeout=60))
    # a 64 KiB run of letters, a line of 16,000 repeated pairs and a bar bracket that never closes: once
    # minutes per line, then 16 s of CPU (each repeated name looked back to the line's start), now linear.
    # The child's CPU time, not the wall clock: other tests' load stretches the one, not the other.
    (tmp_path / "slow.log").write_text("step 1 loss 2.0\n" + "Q" * 70_000 + " loss 1.0\n"
                                       + "1/2 [" + "a=1," * 16_000 + "\n" + ("1/2 [" * 13_000) + "]\n")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = run_trainguard("diagnose", str(tmp_path / "slow.log"), timeout=120)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert out.returncode in (0, 1, 2) and "internal error" not in out.stderr
    assert (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime) < 8


def test_memory_per_line_is_bounded_in_tables(tmp_path: Path) -> None:
    import subprocess
    import sys

    big = tmp_path / "big.jsonl"
    with open(big, "wb") as f:
        f.write(b'{"step": 1, "loss": 2.0}\n{"a": "')
        for _ in range(200):
            f.write(b"x" * (1 << 20))  # a 200 MB line, written in pieces
        f.write(b'"}\n{"step": 2, "loss": 1.9}\n')
    # VmHWM: this process's own peak (ru_maxrss would carry the parent's peak over fork and exec)
    code = ("import sys; from trainguard.cli import main; sys.argv = ['trainguard', 'diagnose', sys.argv[1]]\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "print([ln for ln in open('/proc/self/status') if ln.startswith('VmHWM')][0].split()[1])")
    done = subprocess.run([sys.executable, "-c", code, str(big)], capture_output=True, text=True, timeout=300)
    assert "2 steps" in done.stdout, done.stdout + done.stderr
    assert int(done.stdout.strip().splitlines()[-1]) < 150 * 1024, "a 200 MB line must not be held whole"  # KiB
