"""Device telemetry on a real card (issue 37): NVML reads the GPU, the event set registers, the probe finds its
own GPU by PCI bus id, and a healthy GPU run records samples and no device finding. Xid events cannot be
provoked on purpose; their path is tested on recorded telemetry (tests/test_devices.py).

Run: PYTHONPATH=src pytest -p no:xdist -q tests/test_devices_gpu.py   (skipped without CUDA or nvidia-ml-py)
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(importlib.util.find_spec("pynvml") is None, reason="needs nvidia-ml-py (the gpu extra)"),
]


def test_nvml_reads_clocks_temperature_power_and_memory() -> None:
    from trainguard.devices.nvml import Gpu

    gpu = Gpu.open(index=0)
    assert gpu is not None and gpu.pci and gpu.name
    try:
        s = gpu.sample()
        print(json.dumps(s))
        assert s["sm_clock_mhz"] and s["sm_clock_mhz"] > 0 and s["mem_clock_mhz"] and s["mem_clock_mhz"] > 0
        assert s["temp_c"] and 10 < s["temp_c"] < 110
        assert s["power_w"] and s["power_w"] > 0
        assert s["mem_total_mb"] and s["mem_total_mb"] > 1000 and s["mem_used_mb"] is not None
        assert isinstance(s["throttle"], list)
        events = gpu.xid_events()
        assert events is not None, "the NVML event set did not register for Xid events on this GPU"
        t0 = time.perf_counter()
        assert events.wait(200) == []  # a healthy card: the wait times out with nothing
        assert time.perf_counter() - t0 < 2.0
        events.close()
    finally:
        gpu.close()


def test_the_probe_finds_its_own_gpu_by_pci_bus_id() -> None:
    from trainguard.devices.sampler import _cuda_started, _open_current_gpu

    torch.zeros(1, device="cuda")  # this process initialises CUDA (trainguard never does)
    assert _cuda_started()
    gpu = _open_current_gpu()
    assert gpu is not None
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    if isinstance(getattr(props, "pci_bus_id", None), int):
        assert int(gpu.pci.split(":")[1], 16) == props.pci_bus_id
    gpu.close()


SCRIPT = textwrap.dedent('''
    import sys, time, torch, trainguard
    model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    guard = trainguard.watch(model, opt, run_dir=sys.argv[1])
    t_end = time.time() + 14
    step = 0
    while time.time() < t_end:
        x = torch.randn(256, 1024, device="cuda")
        loss = model(x).pow(2).mean()
        opt.zero_grad(); loss.backward(); opt.step(); guard.step(loss)
        step += 1
    guard.finish()
''')


def test_healthy_gpu_run_records_samples_and_no_device_finding(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(SCRIPT)
    out = subprocess.run([sys.executable, str(tmp_path / "train.py"), str(tmp_path / "run")], capture_output=True,
                         text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    from trainguard.store.reader import RunReader

    with RunReader(tmp_path / "run") as reader:
        samples = reader.events("device-sample")
        devices = reader.events("device")
    assert len(samples) >= 2, "the sampler recorded fewer than two samples in 14 s"
    assert all(s["rank"] == 0 and s["data"]["pci"] for s in samples)
    assert max(s["data"]["util_percent"] or 0 for s in samples) > 0
    assert not [d for d in devices if d["data"].get("serious")], devices
    status = json.loads((tmp_path / "run" / "status.json").read_text())
    assert not [f for f in status["findings"] if f["code"] in ("TG571", "TG572")], status["findings"]
