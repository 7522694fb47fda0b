"""One GPU, read through NVML (nvidia-ml-py's `pynvml`, imported here and only here).

    gpu = Gpu.open(pci="0000:3b:00")       # None without pynvml, a driver or that GPU: telemetry is off
    gpu.sample()                           # clocks, temperature, power, memory, throttle reasons, ECC, remaps
    events = gpu.xid_events()              # an NVML event set for Xid and ECC events, or None
    events.wait(1000)                      # -> [event data], after at most 1 s

Each field is read on its own: a GPU that does not support one (ECC on a consumer card, row remapping
before Ampere) gives None for it, never an error for the sample. NVML talks to the driver; it does not
touch the CUDA context, launch anything or wait for the GPU's work.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from trainguard.devices.kmsg import normal_pci
from trainguard.devices.xid import describe

# clock event (throttle) reason bits, as NVML defines them
THROTTLE_BITS = {
    0x1: "gpu-idle", 0x2: "applications-clocks-setting", 0x4: "sw-power-cap", 0x8: "hw-slowdown",
    0x10: "sync-boost", 0x20: "sw-thermal-slowdown", 0x40: "hw-thermal-slowdown", 0x80: "hw-power-brake-slowdown",
    0x100: "display-clock-setting",
}
# the reasons that slow a training step for a cause outside the code (heat, the power supply, the board)
SLOWING = ("hw-slowdown", "sw-thermal-slowdown", "hw-thermal-slowdown", "hw-power-brake-slowdown")
EVENT_XID = 0x8
EVENT_DOUBLE_BIT_ECC = 0x2


def _nvml() -> Any:
    import pynvml  # nvidia-ml-py, the `gpu` extra; absent: telemetry is off

    return pynvml


class Gpu:
    def __init__(self, nv: Any, handle: Any, index: int | None) -> None:
        self.nv = nv
        self.handle = handle
        self.index = index
        self.pci = _safe(lambda: normal_pci(_text(nv.nvmlDeviceGetPciInfo(handle).busId)))
        self.name = _safe(lambda: _text(nv.nvmlDeviceGetName(handle)))
        self.uuid = _safe(lambda: _text(nv.nvmlDeviceGetUUID(handle)))

    @classmethod
    def open(cls, *, pci: str | None = None, uuid: str | None = None, index: int | None = None) -> Gpu | None:
        """The GPU named by its PCI bus id, its UUID or its NVML index (in that order of preference)."""
        try:
            nv = _nvml()
            nv.nvmlInit()
        except Exception:  # no pynvml, no driver, no permission: telemetry is off
            return None
        try:
            if pci:
                handle = nv.nvmlDeviceGetHandleByPciBusId(pci if pci.count(":") == 2 and "." in pci else pci + ".0")
            elif uuid:
                handle = nv.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith(("GPU-", "MIG-")) else "GPU-" + uuid)
            elif index is not None:
                handle = nv.nvmlDeviceGetHandleByIndex(index)
            else:
                raise ValueError("no GPU named")
            idx = _safe(lambda: int(nv.nvmlDeviceGetIndex(handle)))
            return cls(nv, handle, idx if idx is not None else index)
        except Exception:
            _safe(nv.nvmlShutdown)
            return None

    def close(self) -> None:
        _safe(self.nv.nvmlShutdown)

    def sample(self) -> dict[str, Any]:
        nv, h = self.nv, self.handle
        mem = _safe(lambda: nv.nvmlDeviceGetMemoryInfo(h))
        mask = _safe(lambda: int(_throttle_fn(nv)(h)))
        remap = _safe(lambda: nv.nvmlDeviceGetRemappedRows(h))
        return {
            "gpu": self.index, "pci": self.pci,
            "sm_clock_mhz": _safe(lambda: int(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM))),
            "mem_clock_mhz": _safe(lambda: int(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM))),
            "temp_c": _safe(lambda: int(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU))),
            "power_w": _safe(lambda: round(nv.nvmlDeviceGetPowerUsage(h) / 1000.0, 1)),
            "power_limit_w": _safe(lambda: round(nv.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0, 1)),
            "mem_used_mb": round(mem.used / 2**20, 1) if mem is not None else None,
            "mem_total_mb": round(mem.total / 2**20, 1) if mem is not None else None,
            "util_percent": _safe(lambda: int(nv.nvmlDeviceGetUtilizationRates(h).gpu)),
            "throttle": [name for bit, name in THROTTLE_BITS.items() if mask is not None and mask & bit],
            "ecc_uncorrected": _safe(lambda: int(nv.nvmlDeviceGetTotalEccErrors(
                h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC))),
            "ecc_corrected": _safe(lambda: int(nv.nvmlDeviceGetTotalEccErrors(
                h, nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_VOLATILE_ECC))),
            "remap_uncorrected": int(remap[1]) if remap is not None else None,
            "remap_pending": bool(remap[2]) if remap is not None else None,
            "remap_failed": bool(remap[3]) if remap is not None else None,
        }

    def xid_events(self) -> XidEvents | None:
        """An event set registered for this GPU's Xid (and double-bit ECC) events, or None where unsupported."""
        nv = self.nv
        try:
            supported = int(nv.nvmlDeviceGetSupportedEventTypes(self.handle))
            wanted = supported & (EVENT_XID | EVENT_DOUBLE_BIT_ECC)
            if not wanted:
                return None
            es = nv.nvmlEventSetCreate()
        except Exception:
            return None
        try:
            nv.nvmlDeviceRegisterEvents(self.handle, wanted, es)
        except Exception:
            _safe(lambda: nv.nvmlEventSetFree(es))
            return None
        return XidEvents(nv, es, self, registered=wanted)


class XidEvents:
    """An NVML event set of one GPU: `wait` blocks at most its timeout (ctypes releases the GIL meanwhile)."""

    def __init__(self, nv: Any, es: Any, gpu: Gpu, registered: int) -> None:
        self.nv, self.es, self.gpu, self.registered = nv, es, gpu, registered

    def wait(self, timeout_ms: int) -> list[dict[str, Any]]:
        nv = self.nv
        wait: Callable[..., Any] = getattr(nv, "nvmlEventSetWait_v2", None) or nv.nvmlEventSetWait
        try:
            data = wait(self.es, timeout_ms)
        except Exception as exc:
            if getattr(exc, "value", None) == getattr(nv, "NVML_ERROR_TIMEOUT", 10):
                return []
            raise
        kind = int(data.eventType)
        if kind & EVENT_XID:
            number = int(data.eventData)
            meaning, serious = describe(number)
            return [{"source": "nvml", "what": "xid", "xid": number, "gpu": self.gpu.index, "pci": self.gpu.pci,
                     "serious": serious, "meaning": meaning,
                     "text": f"Xid {number} ({meaning}) on GPU {self.gpu.index}"}]
        if kind & EVENT_DOUBLE_BIT_ECC:
            return [{"source": "nvml", "what": "ecc", "gpu": self.gpu.index, "pci": self.gpu.pci, "serious": True,
                     "text": f"uncorrectable (double-bit) ECC error on GPU {self.gpu.index}"}]
        return []

    def close(self) -> None:
        _safe(lambda: self.nv.nvmlEventSetFree(self.es))


def _throttle_fn(nv: Any) -> Callable[[Any], Any]:
    # renamed "clocks event reasons" in newer NVML; the old name stays for older drivers' bindings
    fn = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
    return fn if fn is not None else nv.nvmlDeviceGetCurrentClocksThrottleReasons


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _safe(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception:
        return None
