"""TG57x: hardware beside the symptoms. Device events (devices/: Xid, ECC, row remaps, throttling, the kernel
log) joined to the training's own findings on one timeline (issue 37).

- `DeviceTimeline` keeps the run's recent device events and which GPU each rank trains on; the engine
  asks it, for every symptom finding (a NaN, a spike, a divergence, a stall, a straggler, a slow step),
  whether a device event on the same rank came within the symptom's window, and the finding says so:
  "came 2.0 s after Xid 79 (GPU has fallen off the bus) on GPU 3 of rank 3", or, where telemetry ran and
  saw nothing, "no device event on any rank: look at the code".
- TG571 device-fault: a serious device event (an Xid of the fault kinds, an uncorrectable ECC error, a row
  remap that failed) is a finding of its own, with the fix for the node.
- TG572 device-event-noted: device events that no symptom came with, as a note, NOTE_AFTER seconds after the
  event (live: the engine's `tick`), so it reaches status.json while the run goes on; an info, never a warning.
"""

from __future__ import annotations

import collections
from typing import Any

from trainguard.contract import EVENT_CHECKPOINT_CHECK, EVENT_DEVICE, EVENT_DEVICE_SAMPLE
from trainguard.findings import DEVICE, Code, Finding
from trainguard.rules.contracts_data import ReplicasDiverged
from trainguard.rules.divergence import LossDiverging, LossSpike
from trainguard.rules.numerics import GradScalerCollapse, NonfiniteGrad, NonfiniteLoss
from trainguard.rules.process import ThroughputDrop
from trainguard.rules.ranks import NonfiniteOnOneRank, RankStopped, StragglerRank
from trainguard.rules.rule import Rule

WINDOW_BEFORE = 120.0  # seconds before a symptom in which a device event is named as its likely cause
WINDOW_AFTER = 5.0  # ... and after it (a step's row is stamped when it closes; the event may be logged later)
NOTE_AFTER = WINDOW_AFTER  # seconds a device event waits for a symptom to name it before it is noted (TG572)
KEEP = 512  # device events kept for attribution (the newest)
# the findings that are symptoms a device can cause (the watchdog adds its stalls and hangs: supervisor.py)
SYMPTOMS = frozenset(rule.name for rule in (
    NonfiniteLoss, NonfiniteGrad, GradScalerCollapse, LossSpike, LossDiverging, NonfiniteOnOneRank,
    StragglerRank, ThroughputDrop, RankStopped, ReplicasDiverged,
))


class DeviceTimeline:
    """The device events of a run, as the rules stream them, and the GPU each rank runs on."""

    def __init__(self) -> None:
        self.events: collections.deque[dict[str, Any]] = collections.deque(maxlen=KEEP)
        self.pci_rank: dict[tuple[Any, str], int] = {}  # (host, PCI bus id) -> the rank whose samples name it
        self.telemetry = False  # a device sample was seen: the absence of events means something
        self.attributed: set[int] = set()  # ids of the device events a symptom named

    def note(self, event: dict[str, Any]) -> bool:
        """Keeps a device event or sample; True for a device event that is not a fault (one TG572 may note)."""
        kind, data = event.get("kind"), event.get("data")
        if not isinstance(data, dict):
            return False
        if kind == EVENT_DEVICE_SAMPLE:
            self.telemetry = True
            rank = event.get("rank")
            if isinstance(data.get("pci"), str) and isinstance(rank, int) and rank >= 0:
                self.pci_rank[(data.get("host"), data["pci"])] = rank
        elif kind == EVENT_DEVICE and isinstance(event.get("t"), (int, float)):
            self.telemetry = True
            self.events.append(event)
            return not data.get("serious")
        return False

    def rank_of(self, event: dict[str, Any]) -> int | None:
        """The rank a device event concerns: the one training on its GPU, else the rank that recorded it."""
        data = event.get("data") or {}
        key = (data.get("host"), data.get("pci"))
        if key in self.pci_rank:
            return self.pci_rank[key]
        rank = event.get("rank")
        return rank if isinstance(rank, int) and rank >= 0 else None

    def explain(self, rank: int, t: float | None, after: float = WINDOW_AFTER) -> tuple[str, dict[str, Any]] | None:
        """A sentence (and evidence) on device events around a symptom of `rank` at time `t` (from
        WINDOW_BEFORE before it to `after` seconds after: a stall's whole length); None when telemetry never
        ran (nothing can be said either way)."""
        if not self.telemetry or t is None:
            return None
        near = [e for e in self.events if t - WINDOW_BEFORE <= e["t"] <= t + max(after, WINDOW_AFTER)]
        mine = [e for e in near if self.rank_of(e) == rank]
        if mine:
            e = max(mine, key=lambda x: (bool(x["data"].get("serious")), x["t"]))
            self.attributed.add(id(e))
            return _sentence(e, t, self.rank_of(e)), {"device_event": _evidence(e, t, rank)}
        if near:
            e = max(near, key=lambda x: (bool(x["data"].get("serious")), x["t"]))
            other = self.rank_of(e)
            return (f"no device event on rank {rank}'s GPU; on rank {other}: {_sentence(e, t, other)}",
                    {"device_event": _evidence(e, t, other), "device_event_same_rank": False})
        return ("no device event on any rank: look at the code",
                {"device_event": None, "device_window_s": [WINDOW_BEFORE, WINDOW_AFTER]})


def annotate(f: Finding, timeline: DeviceTimeline, t: float | None, after: float = WINDOW_AFTER,
             symptoms: frozenset[str] = SYMPTOMS) -> Finding:
    """A symptom finding, told whether a device event on its rank came with it (in place; returned)."""
    if f.name not in symptoms or "device_event" in (f.evidence or {}):
        return f
    rank: int = f.evidence["rank"] if isinstance(f.evidence.get("rank"), int) else 0
    said = timeline.explain(rank, t if t is not None else f.t, after)
    if said is not None:
        sentence, evidence = said
        f.summary = f"{f.summary.rstrip('.')}; {sentence}"
        f.evidence = {**f.evidence, **evidence}
    return f


def _sentence(e: dict[str, Any], t: float, rank: int | None) -> str:
    d = e["data"]
    gap = t - e["t"]
    what = d.get("text") or d.get("what")
    where = "" if rank is None else f" of rank {rank}"
    if gap >= 0:
        return f"came {gap:.1f} s after {what}{where}"
    # a stall is dated by its last progress: the event that froze it comes after that moment
    return f"{what}{where} came {-gap:.1f} s after it began"


def _evidence(e: dict[str, Any], t: float, rank: int | None) -> dict[str, Any]:
    d = e["data"]
    keep = ("what", "xid", "meaning", "gpu", "pci", "serious", "text", "line", "count", "reasons")
    return {**{k: d[k] for k in keep if k in d}, "rank": rank, "t": e["t"], "seconds_before": round(t - e["t"], 3)}


class DeviceFault(Rule):
    """TG571 device-fault: the GPU reported a hardware fault (a serious Xid, uncorrectable ECC, a failed row remap).

    ## What it detects
    A `device` event marked serious: an Xid the driver raises for the device or its memory
    (48, 63, 64, 74, 79, 92, 94, 95, 119, 120...: devices/xid.py), an uncorrectable ECC count that rose, a
    row remapping that failed, recorded by the probe's telemetry (NVML's event set, the kernel log).

    ## Why it matters
    The numbers the GPU computes (or the memory it holds) can no longer be trusted; the NaN,
    the hang or the crash that follows is the hardware's, not the code's, and restarting on the same GPU
    repeats it.

    ## Example
    `TG571 device-fault [error] at step 4,100: Xid 79 (GPU has fallen off the bus) on GPU 3 of
    rank 3`.

    ## What to change
    Drain the node (or exclude the GPU: CUDA_VISIBLE_DEVICES, the scheduler's exclude list),
    have it reset or replaced, and restart from the last verified checkpoint on healthy hardware.

    ## Known false positives
    An Xid that an application's own bug also raises (13, 31, 43) is not counted
    serious; a driver that reports a serious Xid number for a recoverable condition would be.

    ## Options
    None.
    """

    code, name, severity = "TG571", "device-fault", "error"
    needs = (DEVICE,)

    def __init__(self, plan: dict[str, Any]) -> None:
        super().__init__(plan)
        self.last_ok: str | None = None
        self.last_step: int | None = None

    def on_step(self, row: dict[str, Any]) -> None:
        self.last_step = row.get("step") if isinstance(row.get("step"), int) else self.last_step

    def on_event(self, event: dict[str, Any]) -> Finding | None:
        d: dict[str, Any] = event["data"] if isinstance(event.get("data"), dict) else {}
        kind = event.get("kind")
        if kind == EVENT_CHECKPOINT_CHECK and d.get("status") == "verified":
            self.last_ok = d.get("path")
            return None
        if kind != EVENT_DEVICE or not d.get("serious"):
            return None
        rank = event.get("rank")  # (the engine says "rank N:" for a rank other than 0)
        restart = (f"restart from the last verified checkpoint, {self.last_ok}" if self.last_ok else
                   "restart from the last checkpoint you trust")
        return self.finding(
            step=event.get("step") if isinstance(event.get("step"), int) else self.last_step,
            summary=str(d.get("text") or d.get("what")),
            fix=(f"Drain the node or exclude GPU {d.get('gpu', d.get('pci', '?'))} (CUDA_VISIBLE_DEVICES, the "
                 f"scheduler's exclude list), have it reset or replaced, then {restart} on healthy hardware."),
            evidence={k: d[k] for k in ("what", "xid", "meaning", "gpu", "pci", "count", "total", "line", "source")
                      if k in d} | {"rank": rank, "t": event.get("t")},
            cause=f"{d.get('what')}:{d.get('pci') or d.get('gpu')}:{d.get('xid', '')}")


def noted_findings(events: list[dict[str, Any]], timeline: DeviceTimeline) -> list[Finding]:
    """One TG572 per cause (what happened, on which host and GPU; which process for the OOM killer and a hung
    task) of `events`; a cause already noted is not noted again (the engine's de-duplication)."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for e in events:
        d = e["data"]
        cause = f"{d.get('what')}:{d.get('host') or ''}:{d.get('pci') or d.get('gpu') or ''}"
        if d.get("what") in ("oom-killer", "hung-task"):
            cause += f":{d.get('pid')}"
        groups.setdefault(cause, []).append(e)
    return [noted_finding(group, timeline, cause) for cause, group in groups.items()]


def noted_finding(events: list[dict[str, Any]], timeline: DeviceTimeline, cause: str | None = None) -> Finding:
    """TG572 device-event-noted: the GPU or the kernel reported something no symptom of the run came with.

    ## What it detects
    `device` events that are not faults (a thermal or power-brake slowdown, corrected ECC
    errors, a pending row remap, a hung task, the OOM killer) and that no NaN, spike, stall or slow-step
    finding was attributed to within 5 s of the event; noted while the run goes on, one note per
    kind of event and GPU (per process for the OOM killer and hung tasks).

    ## Why it matters
    Nothing went wrong that trainguard saw, but the node is telling something: a GPU that
    throttles is slower than its peers; a pending remap needs a reset.

    ## Example
    `TG572 device-event-noted [info]: 2 device events with no symptom: GPU 0 slowed its clocks:
    hw-thermal-slowdown (SM 1410 MHz, 87 C, 700 W)`.

    ## What to change
    Nothing for this run; tell whoever keeps the node (cooling, power, a reset at the next
    maintenance).

    ## Known false positives
    None known.

    ## Options
    None.
    """
    first = events[0]
    return Finding.of(
        DEVICE_EVENT_NOTED, step=first.get("step"), t=first.get("t"), cause=cause,
        summary=(f"{len(events)} device event(s) with no symptom of the run within {NOTE_AFTER:.0f} s: "
                 + "; ".join(str(e['data'].get('text') or e['data'].get('what')) for e in events[:3])),
        evidence={"events": [_evidence(e, e["t"], timeline.rank_of(e)) for e in events[:12]], "count": len(events)},
        fix="Nothing for this run; tell whoever keeps the node (cooling, power, a reset at the next maintenance).",
        source="rules")


DEVICE_EVENT_NOTED = Code("TG572", "device-event-noted", "info", needs=(DEVICE,), page=noted_finding)
DEVICE_RULES: list[type[Rule]] = [DeviceFault]
