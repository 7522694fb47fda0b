"""Readers and rules on shapes a fresh corpus of real logs showed (issue 30, fresh4): a traceback a logger
quotes below ERROR level (torch._dynamo's compile fallbacks), an LSF time limit after such warnings, fixed-
decimals evaluations on a converged run, and a log PowerShell wrote as UTF-16. Each case has a twin the
reader or rule must still name. Fixtures are generated here from each writer's contract, never copied.
Run: pytest tests/test_fresh4_readers.py
"""

from __future__ import annotations

import codecs
import math
import random
from pathlib import Path
from typing import Any

import pytest

from trainguard.ingest.diagnose import diagnose_source
from trainguard.ingest.textlog import read_text_log
from trainguard.rules.engine import run_rules

pytestmark = pytest.mark.unit

SEEDS = range(4)


def _diagnose(tmp_path: Path, lines: list[str], *, name: str = "train.log", encoding: str = "utf-8",
              newline: str = "\n") -> Any:
    path = tmp_path / name
    mark = codecs.BOM_UTF16_BE if encoding == "utf-16-be" else b""  # (`utf-16` writes its own, little-endian)
    path.write_bytes(mark + (newline.join(lines) + newline).encode(encoding))
    return diagnose_source(read_text_log(path))


def _severe(d: Any) -> list[str]:
    return [f.code for f in d.findings if f.severity in ("warning", "error")]


# -- a traceback a logger quotes as a warning ------------------------------------------------------------------

# torch 2.0/2.1's `torch._logging` record format: `[%(asctime)s] %(name)s: [%(levelname)s] %(message)s`,
# one record per line of a multi-line message; and the stdlib's common `%(asctime)s - %(name)s - %(levelname)s`
PREFIXES = (
    "[2023-11-29 11:04:57,788] torch._dynamo.convert_frame: [WARNING] ",
    "2024-03-02 10:00:01,123 - trainer - WARNING - ",
    "[2024-03-02 10:00:01] torch._inductor.utils: [INFO] ",
)


def _quoted(prefix: str, exception: str = "FileNotFoundError: [Errno 2] No such file or directory: 'ldconfig'") -> list[str]:
    return [prefix + line for line in (
        "WON'T CONVERT forward /home/u/model.py line 53",
        "due to: ",
        "Traceback (most recent call last):",
        '  File "/usr/lib/python3.10/concurrent/futures/_base.py", line 403, in __get_result',
        "    raise self._exception",
        "torch._dynamo.exc.BackendCompilerFailed: backend='inductor' raised:",
        exception,
        "",
        "Set TORCH_LOGS=\"+dynamo\" and TORCHDYNAMO_VERBOSE=1 for more information",
    )]


def _epoch_lines(first: int, last: int, of: int, rng: random.Random) -> list[str]:
    out = []
    for e in range(first, last + 1):
        loss = 0.04 * math.exp(-e / 30) + 0.001 + rng.uniform(0, 1e-4)
        out.append(f"Epoch [{e}/{of}], Train Loss: {loss:.4f}, Train L1 Loss: {10 * loss:.4f}")
        out.append(f"Epoch [{e}/{of}], Validation Loss: {1.1 * loss:.4f}, Validation L1: {11 * loss:.4f}")
    return out


@pytest.mark.parametrize("prefix", PREFIXES)
@pytest.mark.parametrize("seed", SEEDS)
def test_a_traceback_quoted_in_a_warning_is_no_crash(tmp_path: Path, prefix: str, seed: int) -> None:
    rng = random.Random(seed)
    quoted = _quoted(prefix) * rng.randint(1, 4)
    lines = ["wandb: Syncing run run-0", *quoted, *_epoch_lines(1, 40, 40, rng)]
    d = _diagnose(tmp_path, lines)
    assert d.state == "completed" and "TG501" not in _severe(d), (d.state, _severe(d))
    # the twin: the same warnings, then the run's own traceback, unprefixed, ends the log
    crashed = [*lines[:-20], "Traceback (most recent call last):", '  File "train.py", line 88, in <module>',
               "    loss.backward()", "RuntimeError: CUDA error: an illegal memory access was encountered"]
    d = _diagnose(tmp_path, crashed, name="crashed.log")
    assert "TG501" in _severe(d) or "TG571" in _severe(d), _severe(d)


def test_a_time_limit_after_quoted_warnings_is_the_ending(tmp_path: Path) -> None:
    """LSF's report after a job whose output held only compile-fallback warnings: the scheduler's cut is the
    ending, not the quoted `FileNotFoundError`."""
    lines = [*_quoted(PREFIXES[0]) * 3, "User defined signal 2", "", "-" * 60,
             "Sender: LSF System <lsfadmin@hpc.example.org>",
             "Subject: Job 19593344: <WeightInit_0> in cluster <dcc> Exited", "",
             "TERM_RUNLIMIT: job killed after reaching LSF run time limit.", "Exited with exit code 140.", ""]
    d = _diagnose(tmp_path, lines, name="job.md")
    assert d.state != "crashed" and {"TG552", "TG503"} & set(_severe(d)), (d.state, _severe(d))


def test_an_error_level_traceback_is_not_taken_as_quoted(tmp_path: Path) -> None:
    """`logger.exception` writes at ERROR: a failure the run may not survive; it is not skipped as a warning."""
    rng = random.Random(0)
    lines = [*_epoch_lines(1, 5, 40, rng), *_quoted("2024-03-02 10:00:01,123 - trainer - ERROR - ")]
    d = _diagnose(tmp_path, lines)
    assert d.state != "completed" and _severe(d), (d.state, _severe(d))


# -- evaluations printed to a fixed number of decimals on a converged run -----------------------------------


def _named(events: list[dict], name: str) -> list:
    return [f for f in run_rules(events, {}) if f.name == name]


def _epochs(train: list[float], evals: list[dict], lr: list[float] | None = None) -> list[dict]:
    out: list[dict] = []
    for e, (loss, data) in enumerate(zip(train, evals, strict=True)):
        row: dict[str, Any] = {"kind": "step", "step": e, "t": float(e), "loss": loss}
        if lr is not None:
            row["lr"] = lr[e]
        out += [row, {"kind": "eval", "step": e, "t": float(e), "data": data}]
    return out


@pytest.mark.parametrize("seed", SEEDS)
def test_a_converged_run_printing_four_decimals_is_not_frozen(seed: int) -> None:
    """`Validation Loss: 0.0017, Validation L1: 0.2677` for a dozen epochs while the training loss, which fell
    from 0.64, creeps by 0.3%: the weights settle, the rounded results repeat by design."""
    rng = random.Random(seed)
    n = 300
    train = [0.2 + 0.45 * math.exp(-e / 25) + rng.uniform(-2e-4, 2e-4) for e in range(n)]
    evals = [{"loss": round(0.0017 + 0.01 * math.exp(-e / 20), 4),
              "l1": round(0.2677 + 0.2 * math.exp(-e / 25), 4)} for e in range(n)]
    assert _named(_epochs(train, evals), "eval-metrics-frozen") == []
    # the twin: the same rounded results frozen while the training loss is still falling fast (a stale copy)
    falling = [2.0 * math.exp(-e / 40) + 0.1 for e in range(n)]
    stale = [{"loss": 0.0017, "l1": 0.2677}] * n
    assert _named(_epochs(falling, stale), "eval-metrics-frozen")


@pytest.mark.parametrize("seed", SEEDS)
def test_a_loss_printed_to_two_digits_is_not_said_equal_to_five(seed: int) -> None:
    """`eval loss 0.0019` at five evaluations while `l1` moves: two significant digits cannot show a loss
    equal to five; a loss printed to six (`1.38629`) still can."""
    rng = random.Random(seed)
    train = [0.5 * math.exp(-e / 10) + 0.1 + rng.uniform(0, 0.01) for e in range(12)]
    coarse = [{"loss": 0.0019, "l1": round(0.29 + rng.uniform(0, 0.01), 4)} for _ in range(12)]
    assert _named(_epochs(train, coarse), "eval-metrics-frozen") == []
    fine = [{"loss": 1.38629, "acc": round(0.25 + rng.uniform(-0.02, 0.02), 4)} for _ in range(12)]
    (f,) = _named(_epochs(train, fine), "eval-metrics-frozen")
    assert "ln(4)" in f.summary


# -- LeRobot's console: big-number steps, and a log PowerShell captured as UTF-16 -------------------------------

LEROBOT_LINE = ("INFO 2026-05-06 {hh:02d}:{mm:02d}:59 ot_train.py:357 step:{step} smpl:{smpl} ep:18 epch:{epch:.2f} "
                "loss:{loss:.3f} grdn:{grdn:.3f} lr:1.0e-05 updt_s:0.510 data_s:0.030")


def _big(n: float) -> str:
    """LeRobot's `format_big_number(n)` (precision 0), as its writer defines it."""
    for suffix in ("", "K", "M", "B", "T", "Q"):
        if abs(n) < 1000:
            return f"{n:.0f}{suffix}"
        n /= 1000
    return f"{n:.0f}Q"


def _lerobot(last: int, every: int = 200, *, end: bool = True, powershell: bool = False) -> list[str]:
    out = ["WARNING:root:'torchcodec' is not available in your platform, falling back to 'pyav' as a default decoder"]
    if powershell:  # PowerShell wraps the first stderr line of a native command as an ErrorRecord
        out = [f"python.exe : {out[0]}", "At line:1 char:1", "+ python -m lerobot.scripts.train ...",
               "+ ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~", "    + CategoryInfo          : NotSpecified: (WARNING:root:...:String) "
               "[], RemoteException", "    + FullyQualifiedErrorId : NativeCommandError", ""]
    out.append(f"INFO 2026-05-06 17:13:00 ot_train.py:164 {{'batch_size': 32, 'steps': {last}, 'log_freq': {every}}}")
    for i, step in enumerate(range(every, last + 1, every)):
        loss = 5.9 * math.exp(-step / 2000) + 0.02
        out.append(LEROBOT_LINE.format(hh=17 + i // 60 % 6, mm=i % 60, step=_big(step), smpl=_big(32 * step),
                                       epch=step / 540, loss=loss, grdn=97 * math.exp(-step / 5000) + 2))
    if end:
        out.append("INFO 2026-05-07 00:24:56 ot_train.py:438 End of training")
    if powershell:
        out.append("System.Management.Automation.RemoteException")
        out.append("model.safetensors: 100%|##########| 206M/206M [00:08<00:00, 24.1MB/s]")
    return out


@pytest.mark.parametrize("encoding", ["utf-8", "utf-16", "utf-16-be"])
def test_lerobot_big_number_steps_are_read_exactly(tmp_path: Path, encoding: str) -> None:
    d = _diagnose(tmp_path, _lerobot(20_000), encoding=encoding, newline="\r\n" if encoding != "utf-8" else "\n")
    assert d.state == "completed" and d.steps == 100 and _severe(d) == [], (d.state, d.steps, _severe(d))
    src = read_text_log(tmp_path / "train.log")
    steps = [e["step"] for e in src.events if e.get("kind") == "step"]
    assert steps == list(range(200, 20_001, 200)), steps[:8]
    # the twin: the same writer cut at 6,400 of 20,000 steps, no `End of training`
    cut = _diagnose(tmp_path, _lerobot(6_400, end=False) + [], name="cut.log", encoding=encoding)
    assert cut.state != "completed" and {"TG531", "TG503", "TG552"} & set(_severe(cut)), (cut.state, _severe(cut))


def test_powershell_wrapping_of_stderr_is_no_failure(tmp_path: Path) -> None:
    """`python train.py 2>&1 | Tee-Object log.txt` in Windows PowerShell 5: UTF-16, CRLF, the first stderr line
    wrapped as a NativeCommandError, each empty stderr line as `System.Management.Automation.RemoteException`."""
    d = _diagnose(tmp_path, _lerobot(4_000, powershell=True), encoding="utf-16", newline="\r\n")
    assert d.state == "completed" and _severe(d) == [], (d.state, _severe(d))
    # the twin: a real exception the run ended on, in the same capture
    crashed = [*_lerobot(4_000, end=False, powershell=True)[:-2], "Traceback (most recent call last):",
               '  File "lerobot/scripts/train.py", line 290, in train', "    loss.backward()",
               "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"]
    d = _diagnose(tmp_path, crashed, name="crashed.log", encoding="utf-16", newline="\r\n")
    assert {"TG501", "TG503"} & set(_severe(d)), _severe(d)


# -- a detector's foreground-only losses at exactly 0 together ----------------------------------------------


def _yolox_rows(n: int, empty: set[int], clamped: set[int]) -> list[dict]:
    """YOLOX prints every loss with `{:.1f}`: iou/l1/cls are averaged over foreground matches only, so a batch
    with none prints them as 0.0 while conf_loss (over all anchors) and the total stay finite."""
    rows = []
    for s in range(n):
        iou, cls, conf = round(2.5 - s / n, 1), round(0.7 - 0.3 * s / n, 1), round(4.0 - 3 * s / n, 1)
        if s in empty:
            iou = cls = 0.0
        if s in clamped:
            iou = 0.0  # one part alone at 0: a NaN replaced before it was printed
        rows.append({"kind": "step", "step": s, "t": float(s), "loss": iou + cls + conf,
                     "parts": {"iou_loss": iou, "l1_loss": 0.0, "conf_loss": conf, "cls_loss": cls}})
    return rows


@pytest.mark.parametrize("seed", SEEDS)
def test_foreground_losses_at_zero_together_are_no_clamp(seed: int) -> None:
    rng = random.Random(seed)
    empty = set(rng.sample(range(30, 200), 6))
    assert [f for f in run_rules(_yolox_rows(200, empty, set()), {}) if f.name == "nonfinite-loss"] == []
    clamped = {rng.randrange(40, 200)} - empty
    found = [f for f in run_rules(_yolox_rows(200, empty, clamped), {}) if f.name == "nonfinite-loss"]
    assert found and found[0].cause == "zeroed", [f.summary for f in found]


# -- a crash, then the script relaunched from its last checkpoint into the same log --------------------------


def _steps(first: int, last: int, every: int = 100) -> list[str]:
    return [f"step {s:>8d} | phase 2 | loss_G {2.5 * math.exp(-s / 1e6) + 0.1 * math.sin(s):.4f} | lr 1.00e-05"
            for s in range(first, last + 1, every)]


CRASH = ["Traceback (most recent call last):", '  File "train.py", line 46, in infinite_loader',
         "    for batch in loader:", "RuntimeError: DataLoader worker (pid(s) 1529) exited unexpectedly"]


def test_a_relaunch_from_a_checkpoint_after_a_crash_is_judged_on_its_own(tmp_path: Path) -> None:
    """The process that raised a traceback prints no row after it: a row back before the step reached is the
    script run again from its checkpoint (`Resuming from checkpoint_1225000.pt`), whose end is the log's end."""
    lines = ["Resuming from ./checkpoints/checkpoint_0705000.pt", *_steps(705_000, 1_229_400),
             "Resuming from ./checkpoints/checkpoint_1225000.pt", *CRASH,
             "Resuming from ./checkpoints/checkpoint_1225000.pt", *_steps(1_225_000, 1_499_900),
             "Training complete. Final checkpoint: ./checkpoints/checkpoint_final.pt"]
    d = _diagnose(tmp_path, lines)
    assert d.state == "completed" and "TG501" not in _severe(d), (d.state, _severe(d))
    # the twins: the crash with no relaunch after it; a relaunch that crashes again
    d = _diagnose(tmp_path, lines[:lines.index(CRASH[-1]) + 1], name="crashed.log")
    assert "TG501" in _severe(d), _severe(d)
    again = [*lines[:-1 - len(_steps(1_225_000, 1_499_900))], *_steps(1_225_000, 1_300_000), *CRASH]
    d = _diagnose(tmp_path, again, name="again.log")
    assert "TG501" in _severe(d), _severe(d)


def test_an_ending_line_before_a_rewind_is_not_the_relaunch_s_ending(tmp_path: Path) -> None:
    """detectron2 prints `Total training time` from its hooks even when the loop died: a crash, a relaunch
    that ends on that line, a relaunch from its checkpoint that stops unlogged. The crash is the news."""
    lines = [*_steps(100, 5_800), *CRASH, *_steps(5_500, 15_000),
             "[11/16 07:29:12] d2.engine.hooks INFO: Total training time: 2:44:02 (0:55:51 on hooks)",
             *_steps(14_900, 29_600)]
    d = _diagnose(tmp_path, lines)
    assert d.state != "completed" and {"TG501", "TG531"} & set(_severe(d)), (d.state, _severe(d))
