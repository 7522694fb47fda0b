"""Issue 32's smaller items, one test each (each fails without its fix):

- the Prometheus endpoint `:PORT` listens on 127.0.0.1, not on every interface;
- the distillation recipe's resume loads a checkpoint with torch.load(weights_only=True): a pickle that
  runs code is refused in one line and runs nothing;
- a run's duration in the report comes from the watchdog's monotonic clock: a wall clock set back mid-run
  does not make it negative (and a negative one from an old status is not shown).

    PYTHONPATH=src python -m pytest -p no:xdist -q tests/test_runfolder_small.py
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from trainguard.errors import UserError

pytestmark = pytest.mark.unit


def test_prometheus_port_alone_listens_on_this_machine_only(tmp_path: Path) -> None:
    pytest.importorskip("prometheus_client")
    from trainguard.sinks.prometheus_sink import open_sink

    sink = open_sink(tmp_path, ":0")
    try:
        assert sink.server is not None and sink.server.server_address[0] == "127.0.0.1"
    finally:
        sink.server.shutdown()
        sink.server.server_close()


def test_resume_refuses_a_checkpoint_that_would_run_code(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from trainguard.recipes.distill import checkpoint

    marker = tmp_path / "ran"

    class Planted:
        def __reduce__(self):  # what a hostile checkpoint carries: a call made while unpickling
            return (os.system, (f"touch {marker}",))

    torch.save({"student": {}, "x": Planted()}, tmp_path / "last.pt")
    with pytest.raises(UserError, match="cannot load .* as a checkpoint of plain data"):
        checkpoint.load(tmp_path / "last.pt")
    assert not marker.exists()
    good = {"student": torch.nn.Linear(2, 2).state_dict(), "rng": checkpoint.rng_state(), "best_bpb": float("inf")}
    checkpoint.save(tmp_path / "good.pt", good)
    assert set(checkpoint.load(tmp_path / "good.pt")) == set(good)


def test_a_clock_set_back_mid_run_gives_no_negative_duration(tmp_path: Path) -> None:
    from trainguard.report.build import build_verdict
    from trainguard.report.load import RunData

    def verdict(status: dict) -> float | None:
        (tmp_path / "status.json").write_text(json.dumps(status))
        data = RunData(run_dir=tmp_path, status=status, meta={}, events=[], findings=[])
        return build_verdict(data).duration

    # the wall clock went back an hour while the run lived: started after it ended, by the wall clock
    assert verdict({"state": "completed", "started": 1_700_003_600.0, "ended": 1_700_000_100.0, "duration": 95.5}) == 95.5
    assert verdict({"state": "completed", "started": 1_700_003_600.0, "ended": 1_700_000_100.0}) is None
