"""What the machine says while a run is stalled: GPU use and memory, and kernel log lines that matter.

Both are read once per stall, bounded by a timeout, and return {} where there is nothing to read (no
GPU tool, no permission to read the kernel log), with the reason under "unreadable".
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from typing import Any

TOOL_TIMEOUT = 3.0

# Kernel log lines worth showing beside a hang, each with what it usually means.
KERNEL_SIGNATURES: list[tuple[str, re.Pattern[str], str]] = [
    ("amdgpu-workqueue-hog", re.compile(r"workqueue: amdgpu\S* .*hogged CPU"),
     "the amdgpu driver's memory-restore worker hogged a CPU (seed 003): ROCm user-pointer memory "
     "mappings, often after fork(); use the spawn start method for DataLoader workers or fewer workers"),
    ("nvidia-xid", re.compile(r"NVRM: Xid"),
     "an NVIDIA Xid error: the GPU or its driver reported a fault (look the Xid number up in NVIDIA's table)"),
    ("oom-killer", re.compile(r"(Out of memory|oom-kill|Killed process \d+)", re.I),
     "the kernel's OOM killer ran: host memory ran out"),
    ("hung-task", re.compile(r"blocked for more than \d+ seconds|hung_task", re.I),
     "a task sat in uninterruptible sleep (usually I/O: a network file system, a dead disk)"),
]


def gpu_info() -> dict[str, Any]:
    """Utilisation and memory per GPU, from nvidia-smi or rocm-smi where present."""
    if shutil.which("nvidia-smi"):
        out = _run(["nvidia-smi", "--query-gpu=index,name,utilization.gpu,memory.used,memory.total",
                    "--format=csv,noheader,nounits"])
        if out is None:
            return {"tool": "nvidia-smi", "unreadable": "nvidia-smi failed or timed out"}
        gpus = []
        for line in out.splitlines():
            parts = [p.strip() for p in line.split(",")]
            if len(parts) == 5:
                gpus.append({"index": parts[0], "name": parts[1], "util_percent": _num(parts[2]),
                             "memory_used_mb": _num(parts[3]), "memory_total_mb": _num(parts[4])})
        apps = _run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"])
        return {"tool": "nvidia-smi", "gpus": gpus,
                "processes": [ln.strip() for ln in (apps or "").splitlines() if ln.strip()]}
    if shutil.which("rocm-smi"):
        out = _run(["rocm-smi", "--showuse", "--showmemuse", "--json"])
        if out is None:
            return {"tool": "rocm-smi", "unreadable": "rocm-smi failed or timed out"}
        try:
            return {"tool": "rocm-smi", "gpus": json.loads(out)}
        except ValueError:
            return {"tool": "rocm-smi", "raw": out[:2000]}
    return {}


def kernel_signatures(lines: list[str] | None = None) -> dict[str, Any]:
    """The kernel log's last lines that match a known signature, with what each means."""
    if lines is None:
        from trainguard.watchdog.kernel import kernel_log_tail

        lines = kernel_log_tail(400)
        if lines is None:
            return {"unreadable": "dmesg is not readable here (no CAP_SYSLOG, or a container)"}
    hits = []
    for line in lines:
        for name, pattern, meaning in KERNEL_SIGNATURES:
            if pattern.search(line):
                hits.append({"signature": name, "line": line.strip()[:300], "meaning": meaning})
                break
    return {"matches": hits[-12:]} if hits else {}


def _run(cmd: list[str]) -> str | None:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=TOOL_TIMEOUT)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def _num(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None
