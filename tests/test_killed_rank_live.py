"""A real torchrun job (gloo, CPU) in which one rank SIGKILLs itself mid-run, as the OOM killer would: under
`trainguard run` (with the automatic probe and without it) the killed rank is the cause (TG503, state
killed) and its peers' "Connection closed by peer" only consequences; `trainguard diagnose` of the run's
own output.log says the same. A healthy twin of the same job stays quiet.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from tgtest import run_trainguard

pytestmark = pytest.mark.process

TRAIN = """
import datetime, os, signal, sys
import torch, torch.distributed as dist
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rank = dist.get_rank()
kill_rank = int(os.environ.get("KILL_RANK", "-1"))
torch.manual_seed(rank)
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(40):
    loss = model(torch.randn(16, 8)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    if rank == kill_rank and step == 20:
        os.kill(os.getpid(), signal.SIGKILL)  # what the OOM killer does: no handler, no traceback
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()
    opt.step()
    if rank == 0:
        print(f"step {step} loss {loss.item():.4f}", flush=True)
dist.destroy_process_group()
"""


def _run(tmp_path: Path, ranks: int, kill_rank: int, *extra: str) -> tuple[dict, object]:
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    run_dir = tmp_path / "run"
    out = run_trainguard("run", *extra, "--run-dir", str(run_dir), "--", sys.executable, "-m",
                         "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks), str(script),
                         timeout=240, env={"KILL_RANK": str(kill_rank)})
    return json.loads((run_dir / "status.json").read_text()), out


def _blames(status: dict, rank: int) -> dict:
    assert status["state"] == "killed" and status["signal"] == "SIGKILL", status
    assert not any(f["code"] == "TG501" for f in status["findings"]), status["findings"]
    killed = next(f for f in status["findings"] if f["code"] == "TG503")
    assert killed["evidence"]["rank"] == rank and killed["evidence"]["rank_exit_code"] == -9, killed
    assert killed["summary"].startswith(f"rank {rank} was killed by SIGKILL"), killed["summary"]
    assert "Connection" not in killed["summary"].split(";")[0]
    return killed


def test_a_rank_sigkilled_under_torchrun_is_the_cause_with_the_probe(tmp_path: Path) -> None:
    status, out = _run(tmp_path, 2, 1)
    assert out.returncode == 1, out.stderr[-3000:]
    killed = _blames(status, 1)
    assert any(c.startswith("rank 0") for c in killed["evidence"]["consequences"]), killed["evidence"]
    assert "TG503 run-killed" in out.stderr and "run-crashed" not in out.stderr
    # the same job's output, read afterwards by diagnose
    d = run_trainguard("diagnose", str(tmp_path / "run" / "output.log"), "--json")
    assert d.returncode in (0, 1), d.stderr
    report = json.loads(d.stdout)
    assert report["state"] == "killed", report
    top = report["findings"][0]
    assert top["code"] == "TG503" and top["evidence"]["rank"] == 1, top
    assert not any(f["code"] == "TG501" for f in report["findings"])


def test_a_rank_sigkilled_among_three_without_the_probe_is_the_cause(tmp_path: Path) -> None:
    status, out = _run(tmp_path, 3, 2, "--no-auto")
    assert out.returncode == 1, out.stderr[-3000:]
    killed = _blames(status, 2)
    ranks = {c.split(":")[0] for c in killed["evidence"]["consequences"] if c.startswith("rank")}
    assert ranks <= {"rank 0", "rank 1"} and ranks, killed["evidence"]


def test_the_healthy_twin_stays_quiet(tmp_path: Path) -> None:
    status, out = _run(tmp_path, 2, -1)
    assert out.returncode == 0, out.stderr[-3000:]
    assert status["state"] == "completed", status
    assert not [f for f in status["findings"] if f["severity"] in ("error", "warning")], status["findings"]
