"""The probe's device telemetry: its GPU sampled every few seconds, its Xid events and the node's kernel log
followed, each on a thread of its own, recorded in the run's store with the time and the rank.

    sampler = DeviceSampler(writer, rank=0, local_rank=0, log=selflog.write)
    sampler.start()      # nothing happens until this process has initialised CUDA itself (but a kernel log
                         # named by TRAINGUARD_KERNEL_LOG is followed at once, GPU or not)
    ...
    sampler.stop()

Rows: a `device-sample` event every SAMPLE_EVERY seconds (clocks, temperature, power, memory, throttle
reasons, ECC and remap counters: bookkeeping, plotted, not told); a `device` event when something happened
(`changes`: ECC counts that rose, a row remap that failed, a slowing throttle that began; an Xid from the
NVML event set; a kernel-log line of the GPU, the OOM killer or a hung task). The kernel log is the node's:
only local rank 0 follows it, from /dev/kmsg or what is readable instead (devices/kmsg.py). Bounded: one sample row per GPU per interval, at most MAX_EVENTS device
events per run. Cost: see benchmarks/device_telemetry_check.py. Fail-open: a source that fails is off,
said once in guard.log.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from trainguard.contract import ENV_DEVICES, ENV_KERNEL_LOG, EVENT_DEVICE, EVENT_DEVICE_SAMPLE
from trainguard.devices.nvml import SLOWING

SAMPLE_EVERY = 5.0  # seconds between two samples of the GPU
XID_WAIT_MS = 1000  # an NVML event wait returns at least this often (so the thread can stop)
MAX_EVENTS = 1000  # device events recorded per process: a flapping throttle must not flood the store
DEDUP_S = 10.0  # the same Xid from NVML and from the kernel log is one event


def enabled(environ: Any = os.environ) -> bool:
    """Telemetry is on unless TRAINGUARD_DEVICES=0, and only where pynvml can be imported or a kernel log to
    follow was named (TRAINGUARD_KERNEL_LOG=PATH)."""
    return environ.get(ENV_DEVICES, "1") != "0" and (_has_nvml() or _named_kernel_log(environ))


def _has_nvml() -> bool:
    return importlib.util.find_spec("pynvml") is not None


def _named_kernel_log(environ: Any = os.environ) -> bool:
    return environ.get(ENV_KERNEL_LOG, "0") not in ("", "0")


def changes(prev: dict[str, Any] | None, cur: dict[str, Any]) -> list[dict[str, Any]]:
    """The device events between two samples of one GPU (none at the first: counters from before the run
    are the node's history, not this run's)."""
    if prev is None:
        return []
    out: list[dict[str, Any]] = []
    gpu = cur.get("gpu")

    def rose(key: str) -> int:
        a, b = prev.get(key), cur.get(key)
        return b - a if isinstance(a, int) and isinstance(b, int) and b > a else 0

    base = {"source": "nvml", "gpu": gpu, "pci": cur.get("pci")}
    if n := rose("ecc_uncorrected"):
        out.append({**base, "what": "ecc", "serious": True, "count": n, "total": cur["ecc_uncorrected"],
                    "text": f"{n} uncorrectable ECC error(s) on GPU {gpu} (volatile total {cur['ecc_uncorrected']})"})
    if n := rose("ecc_corrected"):
        out.append({**base, "what": "ecc-corrected", "serious": False, "count": n,
                    "text": f"{n} corrected ECC error(s) on GPU {gpu}"})
    if n := rose("remap_uncorrected"):
        out.append({**base, "what": "remap", "serious": True, "count": n,
                    "text": f"{n} row(s) of GPU {gpu}'s memory remapped after uncorrectable errors"})
    if cur.get("remap_failed") and not prev.get("remap_failed"):
        out.append({**base, "what": "remap-failed", "serious": True,
                    "text": f"row remapping failed on GPU {gpu}: the GPU needs to be replaced"})
    if cur.get("remap_pending") and not prev.get("remap_pending"):
        out.append({**base, "what": "remap-pending", "serious": False,
                    "text": f"a row remap is pending on GPU {gpu}: it takes effect at the GPU's next reset"})
    began = [r for r in cur.get("throttle") or [] if r in SLOWING and r not in (prev.get("throttle") or [])]
    if began:
        out.append({**base, "what": "throttle", "serious": False, "reasons": began,
                    "text": (f"GPU {gpu} slowed its clocks: {', '.join(began)} (SM {cur.get('sm_clock_mhz')} MHz, "
                             f"{cur.get('temp_c')} C, {cur.get('power_w')} W)")})
    return out


class DeviceSampler:
    def __init__(self, writer: Any, *, rank: int, local_rank: int, log: Callable[[str], None],
                 every: float = SAMPLE_EVERY, gpu: Any = None, step_of: Callable[[], int] | None = None) -> None:
        self.writer = writer
        self.rank = rank
        self.local_rank = local_rank
        self.log = log
        self.every = every
        self.gpu = gpu  # a devices.nvml.Gpu, found once this process initialised CUDA (or given: the check)
        self.step_of = step_of  # the optimizer step the run is at (the probe's count: a read, no lock)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._recent: dict[tuple[Any, Any], float] = {}
        self._lock = threading.Lock()
        self.events = 0
        self.samples = 0
        self.cpu_s = 0.0  # CPU seconds this process's telemetry threads spent (for the cost report)
        self.last: dict[str, Any] | None = None
        # PCI bus ids repeat from node to node: samples and events name their host, so a kernel-log Xid of
        # one node is never put on a rank of another (rules/devices.py)
        self.host = platform.node()
        self._kernel_started = False  # the kernel-log follower was started (or found nothing readable)

    def start(self) -> DeviceSampler:
        # A kernel log the user named is followed from the start, GPU or not (a CPU run's OOM kills and hung
        # tasks count too); the node's own kernel log only once this process's GPU is found (below).
        if self.local_rank == 0 and _named_kernel_log():
            self._start_kernel_log()
        if _has_nvml():
            self._spawn(self._sample_loop, "trainguard-devices")
        return self

    def _start_kernel_log(self) -> None:
        from trainguard.devices.kmsg import open_kernel_log

        self._kernel_started = True
        source = open_kernel_log()
        if source is not None:  # nothing readable: off, silently (a container, no CAP_SYSLOG, no journal)
            self._spawn(lambda: self._kernel_loop(source), "trainguard-kmsg")

    def stop(self, timeout: float = 2.0) -> None:
        """Ends the threads (each within a second: their waits are bounded), waiting at most `timeout` each."""
        self._stop.set()
        for t in self._threads:
            if timeout > 0:
                t.join(timeout)
        if self.gpu is not None and not any(t.is_alive() for t in self._threads):
            self.gpu.close()  # (left open while a thread may still read it: NVML's own teardown at exit)

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        t = threading.Thread(target=self._guarded(target, name), name=name, daemon=True)
        self._threads.append(t)
        t.start()

    def _guarded(self, target: Callable[[], None], name: str) -> Callable[[], None]:
        def run() -> None:
            cpu0 = time.thread_time()
            try:
                target()
            except Exception as exc:
                # Why not raise: telemetry is beside the training; a source that fails is off, said once.
                self.log(f"device telemetry ({name}) failed and is off: {exc!r}")
            finally:
                self.cpu_s += time.thread_time() - cpu0
        return run

    # -- the GPU's samples ------------------------------------------------------------------------------

    def _sample_loop(self) -> None:
        while self.gpu is None:
            if self._stop.wait(self.every):
                return
            if _cuda_started():
                self.gpu = _open_current_gpu()
                if self.gpu is None:
                    return  # NVML cannot see this process's GPU: off, silently
        events = self.gpu.xid_events()
        if events is not None:
            self._spawn(lambda: self._xid_loop(events), "trainguard-xid")
        if self.local_rank == 0 and not self._kernel_started:
            self._start_kernel_log()
        prev = None
        while True:
            cur = {**self.gpu.sample(), "host": self.host}
            self.writer.add_event(EVENT_DEVICE_SAMPLE, "gpu", cur)
            self.samples += 1
            self.last = cur
            for event in changes(prev, cur):
                self._event(event)
            prev = cur
            if self._stop.wait(self.every):
                return

    def _xid_loop(self, events: Any) -> None:
        try:
            while not self._stop.is_set():
                for event in events.wait(XID_WAIT_MS):
                    self._event(event)
        finally:
            events.close()

    def _kernel_loop(self, source: Any) -> None:
        try:
            while not self._stop.is_set():
                if source.wait(1.0):
                    for event in source.read():
                        self._event(event)
        finally:
            source.close()

    def _event(self, data: dict[str, Any]) -> None:
        """Records one device event (an Xid seen by NVML and in the kernel log is recorded once)."""
        now = time.time()
        with self._lock:
            if self.events >= MAX_EVENTS:
                return
            # (the OOM killer writes two lines per kill: "Out of memory: Killed process" and "oom-kill:...")
            if data.get("what") in ("xid", "oom-killer"):
                key = (data.get("xid"), data.get("pci")) if data["what"] == "xid" else ("oom", data.get("pid"))
                if now - self._recent.get(key, 0.0) < DEDUP_S:
                    return
                self._recent[key] = now
            if self.gpu is not None and data.get("pci") == self.gpu.pci and data.get("gpu") is None:
                data = {**data, "gpu": self.gpu.index}
            data = {**data, "host": self.host}
            self.events += 1
        step = None
        if self.step_of is not None:
            try:
                step = self.step_of()
            except Exception:
                step = None
        self.writer.add_event(EVENT_DEVICE, str(data.get("what") or "device"), data, t=now, step=step)


def _cuda_started() -> bool:
    """This process initialised CUDA itself (trainguard never does: it would cost the run a context)."""
    torch = sys.modules.get("torch")
    try:
        return bool(torch is not None and torch.cuda.is_initialized())
    except Exception:
        return False


def _open_current_gpu() -> Any:
    """The NVML handle of the GPU this process's current CUDA device is (by PCI bus id, else by UUID)."""
    from trainguard.devices.nvml import Gpu

    torch = sys.modules["torch"]
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    bus = getattr(props, "pci_bus_id", None)
    if isinstance(bus, int):
        domain = getattr(props, "pci_domain_id", 0) or 0
        device = getattr(props, "pci_device_id", 0) or 0
        gpu = Gpu.open(pci=f"{domain:04x}:{bus:02x}:{device:02x}")
        if gpu is not None:
            return gpu
    uuid = getattr(props, "uuid", None)
    return Gpu.open(uuid=str(uuid)) if uuid is not None else None
