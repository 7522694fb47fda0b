"""What the fuzz campaign of issue 32 found in the readers of other tools' logs, each pinned by the smallest
input that broke it (tests/fuzzing.py finds them; these keep them fixed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainguard.ingest.textlog import read_text_log
from trainguard.rules.signatures import EXITED, match_line

pytestmark = pytest.mark.unit


def test_an_exit_code_of_thousands_of_digits_is_an_exit_line_not_a_crash_of_the_reader() -> None:
    # int() refuses more than 4,300 digits (ValueError): `diagnose` exited 70
    line = f"E1206 07:32:01 5185 api.py:1002] failed (exitcode: -{'9' * 5000}) local_rank: 1 (pid: 5)"
    assert match_line(line) is EXITED


def test_an_openai_logger_table_whose_step_is_nan_is_no_step(tmp_path: Path) -> None:
    # `| step | nan |` closed a record whose step int(nan) refused (ValueError): `diagnose` exited 70
    table = ["-" * 25, "| loss      | 0.5      |", "| step      | nan      |", "-" * 25,
             "-" * 25, "| loss      | 0.4      |", "| step      | 20       |", "-" * 25]
    log = tmp_path / "log.txt"
    log.write_text("\n".join(table * 3) + "\n")
    src = read_text_log(log)
    steps = [e["step"] for e in src.events if e["kind"] == "step"]
    assert steps and all(s == 20 for s in steps)


def test_a_plan_of_thousands_of_comma_groups_states_no_plan(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_text("max_steps: 1" + ",000" * 2000 + "\n" + "\n".join(f"step {s} loss {1 / s:.4f}" for s in range(1, 30)))
    src = read_text_log(log)
    assert src.plan.get("total_steps") is None
    assert [e for e in src.events if e["kind"] == "step"]


def test_lines_of_thousands_of_digits_or_equals_signs_read_in_linear_time(tmp_path: Path) -> None:
    # a progress-bar pattern tried at every digit of a 5,000-digit run took 0.6 s a line, an epoch heading's
    # `=+` 4 s a line of 5,000 `=`: a damaged log of a few hundred such lines ran for minutes
    import time

    digits = "7" * 5000
    lines = [f"[epoch: 1/{digits}, iter: 3/20] total: {digits}", f"End of epoch 5 / {digits}",
             "=" * 5000 + " epoch 3", f"step {digits}/{digits} [loss={digits}"] * 50
    log = tmp_path / "train.log"
    log.write_text("\n".join(lines) + "\n")
    t0 = time.process_time()
    list(read_text_log(log).events)
    assert time.process_time() - t0 < 10  # was minutes (200 lines at 0.6 to 4 s each)


def test_a_root_cause_whose_pid_has_thousands_of_digits_is_read_without_one() -> None:
    from trainguard.rules.firstfailure import read_failures

    lines = ["Root Cause (first observed failure):", "[0]:", "  rank      : 1 (local_rank: 1)",
             f"  exitcode  : -9 (pid: {'4' * 5000})", "=" * 40]
    root = read_failures(lines).root
    assert root is not None and root.rank == 1 and root.exit_code == -9 and root.pid is None


@pytest.mark.parametrize("value", ["inf", "nan", "1e300", "-3"])
def test_a_short_step_key_whose_value_is_no_position_is_no_step(tmp_path: Path, value: str) -> None:
    # `ep: inf, batch: 20, loss: ...` (a writer's short keys, read by name): int(inf) raised OverflowError and
    # `diagnose` exited 70 (textlog_family#45)
    rows = [f"ep: {value}, batch: 20, time: 9.17, loss: 10.98"] + [f"ep: 0, batch: {b}, time: 9.1, loss: {10 - b / 100}"
                                                                 for b in range(40, 200, 20)]
    log = tmp_path / "train.log"
    log.write_text("\n".join(rows) + "\n")
    src = read_text_log(log)
    steps = [e["step"] for e in src.events if e["kind"] == "step"]
    assert steps == sorted(steps) and len(steps) >= 8


def test_a_big_number_step_of_hundreds_of_digits_is_left_as_printed(tmp_path: Path) -> None:
    # LeRobot's `step:1K` is written out from the cadence; a print past any float made int(inf) raise
    # (OverflowError): `diagnose` exited 70
    lines = [f"INFO ts/train.py:200 step:{k}K smpl:{32 * k}K ep:1 epch:0.1 loss:{1 / k:.3f} grdn:1.2 lr:1.0e-04"
             for k in range(1, 12)]
    lines.insert(5, f"INFO ts/train.py:200 step:{'9' * 400}K smpl:1K ep:1 epch:0.1 loss:0.2 grdn:1.2 lr:1.0e-04")
    log = tmp_path / "train.log"
    log.write_text("\n".join(lines) + "\n")
    steps = [e["step"] for e in read_text_log(log).events if e["kind"] == "step"]
    assert steps[:5] == [1000, 2000, 3000, 4000, 5000]  # read on, the cadence from the exact prints kept


def test_a_sample_counter_of_thousands_of_digits_is_no_position(tmp_path: Path) -> None:
    # pytorch/examples' `Train Epoch: 1 [640/60000 (1%)]` with a counter past int()'s 4,300 digits: it raised
    # (ValueError) and `diagnose` exited 70
    lines = [f"Train Epoch: 1 [{64 * i}/1280 (5%)]\tLoss: {1 / i:.4f}" for i in range(1, 15)]
    lines.insert(4, f"Train Epoch: 1 [{'9' * 5000}/1280 (5%)]\tLoss: 0.5")
    log = tmp_path / "train.log"
    log.write_text("\n".join(lines) + "\n")
    assert [e for e in read_text_log(log).events if e["kind"] == "step"]
