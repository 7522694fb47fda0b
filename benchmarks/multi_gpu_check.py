"""Checks that need two GPUs: the probe on a model that is not on cuda:0, and a DDP run over NCCL.

    python benchmarks/multi_gpu_check.py            # on a machine with 2+ CUDA devices

1. One process trains on cuda:1 without `torch.cuda.set_device(1)` (the thread's current device stays 0).
   The probe's device copies must go on cuda:1's stream (an event recorded on cuda:0 would complete
   before the copy and the rows would hold garbage), and its memory samples must read cuda:1. The stored
   losses are compared with the losses read back with `.item()` after the run; no sync is allowed in the
   loop (`set_sync_debug_mode("error")`).
2. `trainguard run` over a two-rank DDP job (NCCL, one GPU a rank, launched like torchrun): it must end
   `completed` with no finding, each rank having written every step.

Prints one JSON line; exit 0 when every check holds.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

import torch


def off_device_zero(run_dir: Path) -> dict:
    import trainguard

    dev = torch.device("cuda:1")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 10)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(4096, 256, device=dev), torch.randint(10, (4096,), device=dev)
    guard = trainguard.watch(model, opt, total_steps=200, run_dir=run_dir)
    losses = []
    torch.cuda.set_sync_debug_mode("error")
    for _ in range(200):
        idx = torch.randint(4096, (256,), device=dev)
        loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
        loss.backward()
        opt.step()
        opt.zero_grad()
        guard.step(loss)
        losses.append(loss.detach())
    torch.cuda.set_sync_debug_mode(0)
    guard.finish()
    want = [v.item() for v in losses]
    con = sqlite3.connect(run_dir / "run.db")
    got = [r[0] for r in con.execute("SELECT loss FROM steps ORDER BY step")]
    samples = [json.loads(r[0]) for r in con.execute("SELECT data FROM events WHERE kind = 'sample'")]
    con.close()
    worst = max((abs(a - b) for a, b in zip(want, got)), default=float("inf"))
    on_dev1 = [s for s in samples if s.get("device") == 1 and s.get("dev_allocated", 0) > 0]
    return {"current_device": torch.cuda.current_device(), "rows": len(got), "max_abs_loss_diff": worst,
            "memory_samples": len(samples), "samples_reading_cuda1": len(on_dev1),
            "ok": len(got) == 200 and worst < 1e-6 and len(on_dev1) == len(samples) > 0}


DDP_SCRIPT = r'''
import os, torch, torch.distributed as dist, trainguard
rank = int(os.environ["RANK"]); torch.cuda.set_device(rank)
dist.init_process_group("nccl")
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(512, 512).cuda(), device_ids=[rank])
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
guard = trainguard.watch(model, opt, total_steps=100)
for step in range(100):
    x = torch.randn(64, 512, device="cuda")
    loss = (model(x) - x).pow(2).mean()
    loss.backward(); opt.step(); opt.zero_grad()
    guard.step(loss)
guard.finish()
dist.destroy_process_group()
'''

LAUNCH = r'''
import os, socket, subprocess, sys
with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
env = {**os.environ, "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
procs = [subprocess.Popen([sys.executable, "ddp.py"], env={**env, "RANK": str(r), "LOCAL_RANK": str(r)}) for r in (0, 1)]
sys.exit(max(p.wait() for p in procs))
'''


def ddp_under_watchdog(work: Path) -> dict:
    (work / "ddp.py").write_text(DDP_SCRIPT)
    (work / "launch.py").write_text(LAUNCH)
    run_dir = work / "run"
    proc = subprocess.run([sys.executable, "-m", "trainguard.cli", "run", "--quiet", "--run-dir", str(run_dir), "--",
                           sys.executable, "launch.py"], cwd=work, capture_output=True, text=True, timeout=300)
    status = json.loads((run_dir / "status.json").read_text())
    con = sqlite3.connect(run_dir / "run.db")
    per_rank = dict(con.execute("SELECT rank, COUNT(*) FROM steps GROUP BY rank").fetchall())
    con.close()
    findings = [f"{f['name']}[{f['severity']}]" for f in status.get("findings", [])]
    return {"exit_code": proc.returncode, "state": status.get("state"), "findings": findings,
            "steps_per_rank": per_rank, "output_tail": (proc.stdout + proc.stderr)[-600:],
            "ok": proc.returncode == 0 and status.get("state") == "completed" and not findings
            and per_rank == {0: 100, 1: 100}}


def main() -> int:
    if torch.cuda.device_count() < 2:
        print(json.dumps({"skipped": f"needs 2 CUDA devices, found {torch.cuda.device_count()}"}))
        return 2
    work = Path(tempfile.mkdtemp(prefix="tg-multigpu-"))
    result = {"device": torch.cuda.get_device_name(0), "devices": torch.cuda.device_count(),
              "torch": torch.__version__,
              "model_on_cuda1": off_device_zero(work / "cuda1"),
              "ddp_nccl_two_ranks": ddp_under_watchdog(work)}
    print(json.dumps(result))
    return 0 if result["model_on_cuda1"]["ok"] and result["ddp_nccl_two_ranks"]["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
