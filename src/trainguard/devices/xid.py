"""Xid errors: the NVIDIA driver's fault reports, by number (NVIDIA's Xid catalogue, the numbers a node's
health checks act on). `serious` marks a fault of the device or its memory after which the GPU cannot be
trusted until it is reset or replaced; the rest are mostly the application's own faults (an illegal
address, a kernel that timed out) that the driver logs too.
"""

from __future__ import annotations

# number -> (what it means, serious)
XIDS: dict[int, tuple[str, bool]] = {
    13: ("graphics engine exception (often the application's own illegal access)", False),
    31: ("GPU memory page fault (often the application's own illegal address)", False),
    32: ("invalid or corrupted push buffer stream", False),
    43: ("GPU stopped processing (a kernel of the application faulted)", False),
    45: ("preemptive cleanup, after an earlier error", False),
    48: ("double-bit ECC error in GPU memory", True),
    61: ("internal micro-controller breakpoint/warning", True),
    62: ("internal micro-controller halt", True),
    63: ("ECC page retirement or row remapping recorded", True),
    64: ("ECC page retirement or row remapping failed", True),
    68: ("video processor exception", False),
    69: ("graphics engine class error", False),
    74: ("NVLink error", True),
    79: ("GPU has fallen off the bus", True),
    92: ("high single-bit ECC error rate", True),
    94: ("contained ECC error (the application's memory was poisoned)", True),
    95: ("uncontained ECC error (every process on the GPU is affected)", True),
    109: ("context switch timeout", False),
    119: ("GSP RPC timeout", True),
    120: ("GSP error", True),
    121: ("C2C link error", True),
    122: ("SPI PMU RPC read failure", True),
    123: ("SPI PMU RPC write failure", True),
    136: ("link training failure", True),
    140: ("unrecovered ECC error", True),
    143: ("GPU initialization failure", True),
    144: ("NVLink: SAW error", True),
    145: ("NVLink: RLW error", True),
    149: ("NVLink: NETIR error", True),
    154: ("GPU recovery action changed (reset or reboot required)", True),
}


def describe(xid: int) -> tuple[str, bool]:
    """(what Xid `xid` means, serious); an unknown number is described as such and not called serious."""
    return XIDS.get(xid, (f"Xid {xid} (not in trainguard's table: look it up in NVIDIA's Xid catalogue)", False))
