"""A host that waits for a GPU kernel that never ends is a `device-sync` hang (needs CUDA; skips without).

    pytest tests/test_hang_gpu.py

The script trains a few steps on the GPU, then queues a spin kernel of hours (`torch.cuda._sleep`) and
reads a loss with `.item()`: the host thread blocks in the CUDA runtime's synchronisation (spinning, by
CUDA's default, so the process burns CPU too; busy-loop must not win).
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest
from tgtest import run_trainguard

torch = pytest.importorskip("torch")

SCRIPT = textwrap.dedent('''
    import torch
    import trainguard

    model = torch.nn.Linear(64, 1).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    guard = trainguard.watch(model, opt, total_steps=100)
    for step in range(1, 101):
        loss = model(torch.randn(32, 64, device="cuda")).pow(2).mean()
        loss.backward(); opt.step(); opt.zero_grad()
        guard.step(loss)
        if step == 20:
            torch.cuda._sleep(1 << 46)  # a kernel that runs for hours
            print(loss.item())  # PLANTED: the host waits for the GPU
    guard.finish()
''')


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_waiting_for_a_kernel_that_never_ends_is_device_sync(workdir: Path) -> None:
    (workdir / "train.py").write_text(SCRIPT)
    # A wait for the GPU is no proof (the kernel may end): found at the stall timeout, stopped at the limit.
    r = run_trainguard("run", "--quiet", "--run-dir", "run", "--stall-timeout", "5", "--hang-limit", "20", "--",
                       sys.executable, "train.py", cwd=workdir, timeout=180)
    assert r.returncode == 124, r.stderr
    status = json.loads((workdir / "run" / "status.json").read_text())
    hang = next(f for f in status["findings"] if f["name"] == "run-hung")
    line = next(i for i, t in enumerate(SCRIPT.splitlines(), 1) if "PLANTED" in t)
    assert hang["cause"] == "device-sync", hang["summary"]
    assert hang["where"].endswith(f"train.py:{line} (<module>)")
    assert hang["evidence"]["gpu"]["gpus"], "nvidia-smi's reading belongs in the evidence"
    ev = next(f for f in status["findings"] if f["name"] == "run-stalled")["evidence"]
    assert ev["detected_at"] - ev["last_progress_at"] <= 5 + 15
