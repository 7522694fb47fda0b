"""The health rules on what the command prints (trainguard/watchdog/liveoutput.py), under real `trainguard run`.

    pytest -q -n 0 tests/test_liveoutput.py
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

from tgtest import run_trainguard

from trainguard.watchdog import statusline
from trainguard.watchdog.liveoutput import OutputRulesMonitor


def _run(tmp_path: Path, script: str, *args: str) -> dict:
    (tmp_path / "train.py").write_text(textwrap.dedent(script))
    r = run_trainguard("run", "--quiet", "--run-dir", str(tmp_path / "run"), *args, "--", sys.executable, "train.py",
                       cwd=tmp_path)
    assert r.returncode in (0, 1, 122), r.stderr  # 122: completed with error findings (exitcodes.HEALTH)
    return json.loads((tmp_path / "run" / "status.json").read_text())


def test_a_nan_in_the_printed_loss_is_found_while_the_run_goes_on(tmp_path: Path) -> None:
    # No torch, no probe: the printed lines are all there is. The script sleeps after its NaN lines for
    # several of the watchdog's half-second polls, so a finding made live comes well before the end.
    status = _run(tmp_path, """
        import time
        for it in range(0, 60):
            loss = float("nan") if it >= 30 else 4.0 - it * 0.01
            print(f"iter {it}: loss {loss:.4f}, time 10.00ms, mfu -100.00%", flush=True)
            time.sleep(0.01)
        time.sleep(2.5)
        print("training complete", flush=True)
    """)
    found = [f for f in status["findings"] if f["name"] == "nonfinite-loss"]
    assert found and found[0]["step"] == 30
    assert found[0]["evidence"]["read_from"].startswith("the command's printed output")
    # found live: before the run ended (its finding time precedes the end by the script's last sleep)
    assert found[0]["t"] < status["ended"] - 1.5


def test_healthy_printed_output_stays_quiet(tmp_path: Path) -> None:
    status = _run(tmp_path, """
        import math
        for step in range(1, 201):
            lr = 3e-4 * min(1.0, step / 20) * 0.5 * (1 + math.cos(math.pi * step / 200))
            print(f"step {step} | loss {3.0 * math.exp(-step / 80) + 0.5:.4f} | lr {lr:.3e}", flush=True)
            if step % 50 == 0:
                print(f"{{'eval_loss': {0.6 + 1.0 / step:.4f}, 'epoch': {step / 200:.2f}}}", flush=True)
        print("training complete", flush=True)
    """)
    assert status["state"] == "completed"
    assert [f["name"] for f in status["findings"] if f["severity"] in ("warning", "error")] == []


def test_the_scripts_own_guard_keeps_its_data_the_printed_numbers_are_not_fed(tmp_path: Path) -> None:
    # The script prints a NaN loss it never had (a formatting bug), but its guard measures the real loss:
    # the probe's numbers are the run's, so no nonfinite-loss from the print.
    status = _run(tmp_path, """
        import trainguard
        guard = trainguard.watch(total_steps=50)
        for step in range(1, 51):
            guard.step(2.0 - step * 0.01)
            print(f"step {step} loss=nan", flush=True)
        guard.finish()
    """)
    assert status["state"] == "completed"
    assert "nonfinite-loss" not in [f["name"] for f in status["findings"]]


def test_printed_step_loss_and_lr_reach_the_status_line(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "output.log").write_bytes(b"  5%|5 | 10/200 [00:01<00:19, 9.9it/s, loss=2.31, lr=1e-4]\r"
                                         b"step 20 | loss 2.1 | lr 9.0e-05\npartial li")

    class Reader:  # no store behind this run: no probe, no plan
        def events(self, kind: str) -> list:
            return []

        def last_step(self) -> None:
            return None

        def meta(self) -> dict:
            return {}

    class State:
        def __init__(self) -> None:
            self.run_dir, self.reader, self.now, self.output_lines = run_dir, Reader(), 0.0, 2
            self.step, self.phase, self.scratch = None, None, {}

    state = State()
    OutputRulesMonitor().poll(state)
    assert state.scratch["output"] == {"step": 20, "loss": 2.1, "lr": 9.0e-05}
    line = statusline.render(state, 60.0, [], None)
    assert "step 20" in line and "loss 2.1" in line and "lr 9.00e-05" in line


def test_a_multi_line_record_still_open_when_the_process_ends_is_read(tmp_path: Path) -> None:
    # OLMo's console: a `[step=N/M]` line, then its metrics indented one a line; the last record is closed
    # by no later line, only by the process's end. Its NaN is the last step's, and must be found.
    _run(tmp_path, """
        for step in range(1, 41):
            loss = float("nan") if step == 40 else 4.0 - step * 0.02
            print(f"2025-12-11 00:30:18.925\\thost:0\\tolmo.train:979\\tINFO\\t[step={step}/40,epoch=0]")
            print(f"    train/CrossEntropyLoss={loss:.4f}")
            print("    optim/learning_rate_group0=5e-05", flush=True)
    """)
    status = json.loads((tmp_path / "run" / "status.json").read_text())
    nan = [f for f in status["findings"] if f["name"] == "nonfinite-loss"]
    assert nan and nan[0]["step"] == 40, status["findings"]
