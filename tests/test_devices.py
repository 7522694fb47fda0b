"""Device telemetry beside the symptoms (issue 37), on the CPU: kernel-log lines in the kernel's own record
format through a real pipe, samples and events written to a real store by the sampler's own writer path,
real step rows, and the real rules engine reading it all back. Nothing here mocks a rule.

    PYTHONPATH=src python -m pytest -p no:xdist -q tests/test_devices.py
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from trainguard.contract import EVENT_DEVICE_SAMPLE
from trainguard.devices.kmsg import KernelLog, normal_pci, parse_line
from trainguard.devices.sampler import DeviceSampler, changes
from trainguard.report.load import load_run
from trainguard.report.timeline import build_timeline
from trainguard.rules.engine import run_rules
from trainguard.store.reader import RunReader
from trainguard.store.writer import StoreWriter

pytestmark = pytest.mark.unit

XID79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python, GPU has fallen off the bus."
T0 = 1_700_000_000.0


def _sample(pci: str, gpu: int, **over: Any) -> dict[str, Any]:
    """A sample as devices/nvml.py's Gpu.sample() returns it."""
    return {"gpu": gpu, "pci": pci, "sm_clock_mhz": 1980, "mem_clock_mhz": 2619, "temp_c": 55, "power_w": 420.0,
            "power_limit_w": 700.0, "mem_used_mb": 30000.0, "mem_total_mb": 81559.0, "util_percent": 99,
            "throttle": [], "ecc_uncorrected": 0, "ecc_corrected": 0, "remap_uncorrected": 0,
            "remap_pending": False, "remap_failed": False, **over}


def test_kernel_log_lines_parse() -> None:
    x = parse_line(f"[12345.678] {XID79}")
    assert x is not None and x["xid"] == 79 and x["pci"] == "0000:3b:00" and x["serious"] and x["pid"] == 4242
    assert "fallen off the bus" in x["text"]
    app = parse_line("NVRM: Xid (PCI:0000:17:00): 13, pid=99, name=python, Graphics Exception: ESR 0x1")
    assert app is not None and app["xid"] == 13 and not app["serious"]
    oom = parse_line("Out of memory: Killed process 4321 (python) total-vm:123kB, anon-rss:99kB")
    assert oom is not None and oom["what"] == "oom-killer" and oom["pid"] == 4321
    hung = parse_line("INFO: task pt_data_worker:777 blocked for more than 120 seconds.")
    assert hung is not None and hung["what"] == "hung-task" and hung["pid"] == 777
    assert parse_line("usb 1-1: new high-speed USB device") is None
    assert normal_pci("00000000:3B:00.0") == normal_pci("0000:3b:00") == "0000:3b:00"


def test_kernel_log_follower_reads_kmsg_records_from_a_pipe() -> None:
    r, w = os.pipe()
    os.set_blocking(r, False)
    log = KernelLog(r)
    assert log.read() == []  # nothing yet: non-blocking, no wait
    os.write(w, f"4,1001,12345678,-;{XID79}\n SUBSYSTEM=pci\n".encode())
    os.write(w, b"6,1002,12345679,-;eth0: link up\n4,1003,12345680,-;INFO: task python:5 blocked for more than 240 seconds.\n")
    got = log.read()
    assert [e["what"] for e in got] == ["xid", "hung-task"]
    log.close()
    os.close(w)


def test_changes_between_samples() -> None:
    a = _sample("0000:3b:00", 3)
    assert changes(None, _sample("0000:3b:00", 3, ecc_uncorrected=5)) == []  # the node's history, not this run's
    b = _sample("0000:3b:00", 3, ecc_uncorrected=2, ecc_corrected=7, remap_failed=True,
                throttle=["sw-power-cap", "hw-thermal-slowdown"], temp_c=91)
    got = {e["what"]: e for e in changes(a, b)}
    assert got["ecc"]["serious"] and got["ecc"]["count"] == 2
    assert not got["ecc-corrected"]["serious"] and got["remap-failed"]["serious"]
    assert got["throttle"]["reasons"] == ["hw-thermal-slowdown"] and "91 C" in got["throttle"]["text"]
    assert changes(b, b) == []


class _Log:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def write(self, text: str) -> None:
        self.lines.append(text)


def _record_run(run_dir: Path, *, xid_on: int | None, nan_on: int | None, throttle_on: int | None = None,
                xid_gpu_of: int | None = None) -> None:
    """Two ranks (GPUs 0000:17:00 and 0000:3b:00), 60 steps a second apart, committed as the probes commit
    (each rank's writer flushed as the run goes); telemetry written through the probe's sampler (its `_event`
    path and its sample rows); a planted Xid 79 2 s before step 40, or a throttle at step 10."""
    pcis = {0: "0000:17:00", 1: "0000:3b:00"}
    run_dir.mkdir(parents=True, exist_ok=True)
    writers = {r: StoreWriter(run_dir, rank=r) for r in (0, 1)}
    now = {"step": 0}
    samplers = {r: DeviceSampler(writers[r], rank=r, local_rank=r, log=_Log().write, step_of=lambda: now["step"])
                for r in (0, 1)}
    for r, w in writers.items():
        w.set_rank_info({"rank": r, "local_rank": 0, "node": r, "host": f"node{r}", "world_size": 2,
                         "local_world_size": 1, "pid": 100 + r})
    for s in range(1, 61):
        t = T0 + s
        now["step"] = s - 1
        for rank, w in writers.items():
            if xid_on == rank and s == 38:
                # the kernel log is followed by local rank 0 on a node; here each rank is its own node
                event = parse_line(XID79.replace("0000:3b:00", pcis[rank if xid_gpu_of is None else xid_gpu_of]))
                assert event is not None
                samplers[rank]._event(event)
                w._events[-1] = (t, *w._events[-1][1:])  # stamped when seen: at this recorded moment
            if throttle_on == rank and s == 10:
                ev = changes(_sample(pcis[rank], rank), _sample(pcis[rank], rank, throttle=["hw-power-brake-slowdown"]))
                samplers[rank]._event(ev[0])
                w._events[-1] = (t, *w._events[-1][1:])
            loss = float("nan") if nan_on == rank and s >= 40 else 2.0 - s * 0.01
            w.add_step({"step": s, "t": t, "loss": loss, "lr": 1e-3, "grad_norm": 1.0, "step_time": 1.0})
            if s % 5 == 0:
                w.add_event(EVENT_DEVICE_SAMPLE, "gpu", {**_sample(pcis[rank], rank), "host": samplers[rank].host}, t=t)
            w.flush()
    for w in writers.values():
        w.close()


def _findings(run_dir: Path) -> dict[str, Any]:
    with RunReader(run_dir) as reader:
        return {f.name: f for f in run_rules(reader.iter_events(), plan={"world_size": 2})}


def test_nan_after_an_xid_on_the_same_rank_names_it(tmp_path: Path) -> None:
    _record_run(tmp_path, xid_on=1, nan_on=1)
    found = _findings(tmp_path)
    nan = found["nonfinite-loss"]
    assert "came 2.0 s after Xid 79 (GPU has fallen off the bus) on GPU 0000:3b:00 of rank 1" in nan.summary
    assert nan.evidence["device_event"]["xid"] == 79 and nan.evidence["device_event"]["rank"] == 1
    fault = found["device-fault"]
    assert fault.severity == "error" and "Xid 79" in fault.summary and "Drain the node" in fault.fix
    assert "device-event-noted" not in found


def test_a_kernel_log_xid_recorded_by_local_rank_0_is_put_on_the_rank_of_its_gpu(tmp_path: Path) -> None:
    # local rank 0 follows the node's kernel log: the Xid names rank 1's GPU by its PCI bus id
    _record_run(tmp_path, xid_on=0, nan_on=1, xid_gpu_of=1)
    nan = _findings(tmp_path)["nonfinite-loss"]
    assert "came 2.0 s after Xid 79 (GPU has fallen off the bus) on GPU 0000:3b:00 of rank 1" in nan.summary


def test_nan_without_device_events_points_at_the_code(tmp_path: Path) -> None:
    _record_run(tmp_path, xid_on=None, nan_on=1)
    found = _findings(tmp_path)
    assert "no device event on any rank: look at the code" in found["nonfinite-loss"].summary
    assert "device-fault" not in found


def test_an_xid_on_another_rank_is_named_as_such(tmp_path: Path) -> None:
    _record_run(tmp_path, xid_on=0, nan_on=1)
    nan = _findings(tmp_path)["nonfinite-loss"]
    assert "no device event on rank 1's GPU; on rank 0:" in nan.summary
    assert nan.evidence["device_event_same_rank"] is False


def test_a_device_event_with_no_symptom_is_a_note_and_a_healthy_run_is_quiet(tmp_path: Path) -> None:
    _record_run(tmp_path / "a", xid_on=None, nan_on=None, throttle_on=0)
    found = _findings(tmp_path / "a")
    assert set(found) == {"device-event-noted"}
    note = found["device-event-noted"]
    assert note.severity == "info" and "hw-power-brake-slowdown" in note.summary
    _record_run(tmp_path / "b", xid_on=None, nan_on=None)
    assert _findings(tmp_path / "b") == {}


def test_without_telemetry_nothing_is_said(tmp_path: Path) -> None:
    w = StoreWriter(tmp_path, rank=0)
    for s in range(1, 61):
        w.add_step({"step": s, "t": T0 + s, "loss": float("nan") if s >= 40 else 1.0, "lr": 1e-3})
    w.close()
    nan = _findings(tmp_path)["nonfinite-loss"]
    assert "device_event" not in nan.evidence and "device" not in nan.summary


def test_report_timeline_shows_device_events(tmp_path: Path) -> None:
    _record_run(tmp_path, xid_on=1, nan_on=1)
    rows = build_timeline(load_run(tmp_path))
    device = [r for r in rows if r.kind == "device"]
    assert device and "Xid 79" in device[0].what and device[0].severity == "error" and device[0].step == 37
    from trainguard.report.plots import build_plots

    loss = next(p for p in build_plots(load_run(tmp_path)) if p.key == "loss")
    assert [m.label for m in loss.marks if m.kind == "device"] == ["Xid 79"]


def test_a_device_note_waits_a_few_seconds_for_a_symptom_then_comes_while_the_run_goes_on() -> None:
    from trainguard.rules.engine import Engine

    def hung(t: float) -> dict[str, Any]:
        data = parse_line("INFO: task pt_data_worker:777 blocked for more than 122 seconds.")
        return {"kind": "device", "name": "hung-task", "t": t, "step": 3, "rank": 0, "data": {**(data or {}),
                                                                                              "host": "n0"}}

    def row(s: int, loss: float) -> dict[str, Any]:
        return {"kind": "step", "step": s, "t": T0 + s, "loss": loss, "lr": 1e-3, "grad_norm": 1.0, "rank": 0}

    quiet = Engine({})
    assert quiet.feed_all([row(s, 2.0 - s * 0.01) for s in range(1, 11)]) == []
    assert quiet.feed(hung(T0 + 10.5)) == []
    assert quiet.tick(T0 + 12.0) == []  # a symptom may still name it
    note = quiet.tick(T0 + 16.0)  # live: the poll's clock, though the run wrote nothing since
    assert [f.code for f in note] == ["TG572"] and note[0].severity == "info" and note[0].t == T0 + 10.5
    assert quiet.tick(T0 + 30.0) == [] and quiet.end() == []  # said once

    named = Engine({})
    named.feed_all([row(s, 2.0 - s * 0.01) for s in range(1, 11)] + [hung(T0 + 10.5)])
    found = named.feed_all([row(11, float("nan")), row(12, float("nan"))])  # a NaN 0.5 s later names it
    nan = next(f for f in found if f.name == "nonfinite-loss")
    assert "pt_data_worker" in nan.summary
    assert [f.code for f in named.tick(T0 + 30.0) + named.end() if f.code == "TG572"] == []
