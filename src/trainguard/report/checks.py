"""What the guard checked on this run, and what it could not: the catalogue against the data present.

A clean report must say what was verified, not only that nothing was found. A rule counts as checked
when the data it reads was recorded (an LR rule needs the LR, a loss-composition rule needs loss parts,
an artifact rule needs `--expect`). Each rule declares what it reads (`needs`, in the data names of
`trainguard.findings`); `available` says which of them this run recorded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainguard.contract import EVENT_CHECKPOINT_CHECK, EVENT_DEVICE_SAMPLE
from trainguard.findings import (
    CHECKPOINT_CHECKS,
    CHECKPOINTS,
    DATA_WAIT,
    DEVICE,
    DEVICE_MEMORY,
    EVAL,
    EXPECTS,
    EXPERTS,
    GRAD_NORM,
    LOSS,
    LOSS_SCALE,
    LR,
    MEMORY,
    MODEL,
    MODEL_LOSS,
    NODES,
    OUTPUT,
    OUTPUT_SIZE,
    PARTS,
    PREFLIGHT,
    PROBE,
    PROCESS,
    RANKS,
    SCHED_HORIZON,
    STEP_TIME,
    STEPS,
    UPDATE_RATIO,
    WATCHDOG,
    WEIGHTS,
    Data,
)
from trainguard.report.load import RunData


@dataclass
class Check:
    code: str
    name: str
    family: str
    result: str  # "found" | "passed" | "not checked"
    detail: str


def available(data: RunData) -> set[Data]:
    """The data this run recorded, in the names the rules' `needs` use."""
    have = {d for d in (LR, LOSS, GRAD_NORM, UPDATE_RATIO, DATA_WAIT, STEP_TIME, LOSS_SCALE) if data.col(d.key) is not None}
    samples = [e["data"] for e in data.events if e["kind"] == "sample" and e["name"] == "memory"
               and isinstance(e["data"], dict)]
    if samples or any(any(w in k.lower() for w in ("mem", "rss")) for k in data.extra):
        have.add(MEMORY)
    if any("dev_allocated" in s or "dev_total" in s for s in samples):
        have.add(DEVICE_MEMORY)
    if data.events_of("checkpoint"):
        have.add(CHECKPOINTS)
    if data.events_of(EVENT_CHECKPOINT_CHECK):
        have.add(CHECKPOINT_CHECKS)
    if data.events_of(EVENT_DEVICE_SAMPLE):
        have.add(DEVICE)
    if data.events_of("experts"):
        have.add(EXPERTS)
    if (data.run_dir / "output.log").is_file():
        have.add(OUTPUT)
    if data.n_steps:
        have |= {STEPS, PROBE}
    if data.parts:
        have.add(PARTS)
    if data.weights:
        have.add(WEIGHTS)
    if data.events_of("eval"):
        have.add(EVAL)
    if data.events_of("probe"):
        have.add(PROBE)
    if len([r for r in data.ranks if r >= 0]) > 1:
        have.add(RANKS)
    watchdog = data.meta.get("watchdog") or {}
    if watchdog or data.status.get("watched_by") == "watchdog":
        have.add(WATCHDOG)
    if watchdog.get("expects"):
        have.add(EXPECTS)
    if data.status.get("state") not in (None, "running"):
        have.add(PROCESS)
    plan = data.meta.get("plan") or {}
    if plan.get("total_steps") and plan.get("sched_horizon") and plan.get("sched_counted", True) is not False:
        have.add(SCHED_HORIZON)  # without it TG102 only asks whether a warmup outlasts half the run
    if plan.get("model") or any(e["name"] == "model-seen" for e in data.events_of("probe")):
        # the forward contracts ran on it: the watched model, or the one the automatic probe found through
        # torch's global module hooks (probe/modulesight.py); without either, they had nothing to check
        have.add(MODEL)
    if plan.get("model"):
        have.add(MODEL_LOSS)  # (the automatic probe is never handed a loss beside the model's output)
    if plan.get("output_size"):
        have.add(OUTPUT_SIZE)
    if data.schedule or data.events_of("preflight") or data.meta.get("preflight"):
        have.add(PREFLIGHT)
    if _over_nodes(data):
        have.add(NODES)
    return have


def _over_nodes(data: RunData) -> bool:
    """Whether the run spans nodes: a merged folder of several node parts, or one node's part of a job
    whose torchrun said --nnodes above 1 (what TG711, a node going silent, needs)."""
    from trainguard.store.nodes import node_dirs
    from trainguard.watchdog.nodes import parse_launch

    if len(node_dirs(data.run_dir)) > 1:
        return True
    cmd = data.meta.get("command") or data.status.get("command")
    try:
        return isinstance(cmd, list) and parse_launch([str(c) for c in cmd]) is not None
    except (ValueError, TypeError):
        return False


def _available_over_nodes(data: RunData) -> set[Data]:
    """What the run recorded; for a run over nodes, what any node's part recorded too. The merged folder
    has no store of its own, and each node's watchdog checked its part: a rule checked on one node's part
    was checked on the run (a cross-rank rule reads every rank of that node, and the merged ranks)."""
    from trainguard.report.load import load_run
    from trainguard.store.nodes import node_dirs

    have = available(data)
    for part in node_dirs(data.run_dir):
        try:
            have |= available(load_run(part))
        except Exception:  # an unreadable part: the merged view says what it could read
            continue
    if len({r for r in data.ranks if r >= 0}) > 1 or len(node_dirs(data.run_dir)) > 1:
        have.add(RANKS)
    return have


def build_checks(data: RunData) -> list[Check]:
    from trainguard.catalog import CATALOG

    have = _available_over_nodes(data)
    found: dict[str, Any] = {}
    for f in data.findings:
        found.setdefault(f.code, f)
    out = []
    for entry in CATALOG:
        if entry.status == "removed":
            continue
        needs = entry.needs
        if entry.code in found:
            f = found[entry.code]
            at = f" at step {f.step}" if f.step is not None else ""
            out.append(Check(entry.code, entry.name, entry.family, "found", f"found{at}: see the finding"))
            continue
        missing = [n for n in needs if n not in have]
        if missing:
            words = ", ".join(n.words for n in missing)
            out.append(Check(entry.code, entry.name, entry.family, "not checked", f"needs {words}"))
        else:
            words = ", ".join(n.words for n in needs) or "the run"
            out.append(Check(entry.code, entry.name, entry.family, "passed", f"checked on {words}"))
    return out
