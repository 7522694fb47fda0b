"""On one GPU: does reading NCCL's flight recorder return while the device is wedged and another thread
is blocked in a device call behind it?

    python benchmarks/nccl_wedged_read.py     # one CUDA GPU, a NCCL build of torch

Why: a new user's DDP job over NCCL hung on a `dist.barrier()` under `if rank == 0:`, and both ranks' probe
background threads sat in `torch.stack` behind their wedged GPUs. Those threads answered the watchdog's
flight-recorder requests, so no rank answered. Since then the answers come from a thread of their own
(probe/steps.py, `start_flight_answers`). This checks what that thread relies on, on the one GPU a session may
have: a group of one rank, an all-reduce done and one queued behind a device kept busy
(`torch.cuda._sleep`), another thread blocked in its first device call, and the probe's own reader
(`flightrec.snapshot`) called from a third thread with a 20 s limit. Prints one JSON line.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))


def main() -> int:
    import torch
    import torch.distributed as dist

    from trainguard.probe import flightrec

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    t = torch.ones(4, device="cuda")
    dist.all_reduce(t)
    torch.cuda.synchronize()
    out: dict = {"recorder_before": flightrec.snapshot() is not None}
    torch.cuda._sleep(int(3e11))  # minutes of device time: wedged, for this check's purposes
    dist.all_reduce(t)  # queued behind it
    launched = {"n": 0}

    def device_work() -> None:  # as the probe's background thread stacks a step's values
        x = torch.zeros(1, device="cuda")
        for _ in range(200_000):
            x.add_(1)
            launched["n"] += 1

    threading.Thread(target=device_work, daemon=True).start()
    time.sleep(3.0)
    n = launched["n"]
    time.sleep(1.0)
    out["device_thread_blocked"] = launched["n"] == n
    got: dict = {}

    def read() -> None:
        t0 = time.perf_counter()
        got["snapshot"] = flightrec.snapshot()
        got["seconds"] = round(time.perf_counter() - t0, 4)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(20)
    out["recorder_read"] = "snapshot" in got
    out["read_seconds"] = got.get("seconds")
    snap = got.get("snapshot") or {}
    out["in_flight"] = [(a.get("op"), a.get("seq"), a.get("device")) for a in snap.get("active") or []]
    out["torch"] = torch.__version__
    print(json.dumps(out), flush=True)
    os._exit(0)  # (the device stays busy for minutes: no teardown)


if __name__ == "__main__":
    raise SystemExit(main())
