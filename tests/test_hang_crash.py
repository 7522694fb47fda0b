"""Crash signatures (issue 3 §4), each fed the message a real failure produces, not a typed-in copy.

    pytest tests/test_hang_crash.py
"""

from __future__ import annotations

import pickle
import signal

import pytest

from trainguard.rules.crash import classify_crash, crash_finding

torch = pytest.importorskip("torch")


def _cause(exc: BaseException) -> str | None:
    return classify_crash(type(exc).__name__, str(exc))[0]


def test_seed004_bf16_against_float32_outside_autocast() -> None:
    proj = torch.nn.Linear(4, 4)
    with pytest.raises(RuntimeError) as info:
        proj(torch.randn(2, 4, dtype=torch.bfloat16))
    assert "must have the same dtype" in str(info.value)
    assert _cause(info.value) == "dtype-mismatch"


def test_seed001_operation_on_none() -> None:
    step = None
    with pytest.raises(TypeError) as info:
        step % 500  # noqa: B018
    assert _cause(info.value) == "none-operand"
    with pytest.raises(AttributeError) as info2:
        step.item()  # type: ignore[union-attr]
    assert _cause(info2.value) == "none-operand"


def test_a_checkpoint_that_cannot_be_pickled(tmp_path) -> None:
    with pytest.raises((pickle.PicklingError, AttributeError, TypeError)) as info:
        torch.save({"model": {}, "schedule": lambda s: s * 0.5}, tmp_path / "ck.pt")
    assert _cause(info.value) == "unpicklable-checkpoint"


def test_host_out_of_memory() -> None:
    with pytest.raises(RuntimeError) as info:
        torch.empty(1 << 50, dtype=torch.uint8)  # a petabyte
    assert _cause(info.value) == "host-out-of-memory"


class _Dies(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, idx: int):
        import os

        os.kill(os.getpid(), signal.SIGKILL)  # what the OOM killer does to a worker


def test_a_killed_dataloader_worker() -> None:
    loader = torch.utils.data.DataLoader(_Dies(), batch_size=2, num_workers=1)
    with pytest.raises(RuntimeError) as info:
        next(iter(loader))
    assert _cause(info.value) == "dataloader-worker-killed", str(info.value)


def test_the_finding_says_how_long_the_run_went_and_that_the_path_never_ran_before() -> None:
    f = crash_finding(exception="TypeError", message="unsupported operand type(s) for %: 'NoneType' and 'int'",
                      frames=[{"file": "/home/u/proj/train.py", "line": 809, "function": "evaluate", "code": None}],
                      step=1999, phase="eval", elapsed=41 * 60 + 7, phases_seen={"train": 1, "eval": 1})
    assert "in phase 'eval' (the first time this phase ran in this run), at step 1999, after 41 min" in f.summary
    assert f.evidence["phase_first_time"] is True and f.cause == "none-operand"
    again = crash_finding(exception="TypeError", message="x", frames=[], step=4000, phase="eval", elapsed=90.0,
                          phases_seen={"eval": 3})
    assert "in phase 'eval' (run 3 of this phase; earlier runs passed)" in again.summary
