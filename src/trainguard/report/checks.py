"""What the guard checked on this run, and what it could not: the catalogue against the data present.

A clean report must say what was verified, not only that nothing was found. A rule counts as checked
when the data it reads was recorded (an LR rule needs the LR, a loss-composition rule needs loss parts,
an artifact rule needs `--expect`). A catalogue entry may say what it reads in a `needs` attribute (a
tuple of the data names below); otherwise its family decides.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trainguard.report.load import RunData

# what each family reads, by default
FAMILY_NEEDS = {
    "1": ("lr",), "2": ("loss",), "3": ("loss",), "4": ("parts",), "5": ("steps",), "6": ("preflight",),
    "7": ("ranks",), "8": ("model-specific",),
}
# rules that read something more specific than their family's default (codes absent from the catalogue
# are simply unused)
CODE_NEEDS = {
    "TG501": ("process",), "TG502": ("watchdog",), "TG503": ("process",), "TG504": ("expects",),
    "TG505": ("expects",), "TG506": ("probe",), "TG507": ("watchdog",), "TG509": ("watchdog",),
    "TG102": ("lr", "sched_horizon"),
    "TG201": ("update_ratio",), "TG202": ("probe",), "TG203": ("eval",), "TG206": ("loss",), "TG207": ("loss",),
    "TG302": ("grad_norm",), "TG303": ("loss_scale",), "TG404": ("weights",),
    "TG521": ("output",), "TG522": ("step_time",), "TG523": ("data_wait",), "TG524": ("memory",),
    "TG525": ("device_memory",), "TG526": ("checkpoints",), "TG811": ("experts",), "TG812": ("eval",),
}
DATA_WORDS = {
    "lr": "the learning rate", "loss": "the loss", "parts": "loss parts", "steps": "probe steps",
    "preflight": "a preflight run", "ranks": "more than one rank", "watchdog": "the watchdog",
    "expects": "expected artifacts (--expect)", "probe": "the probe", "process": "the process's exit",
    "grad_norm": "gradient norms", "update_ratio": "update ratios", "eval": "evaluations",
    "data_wait": "data-wait times", "weights": "loss-part weights", "model-specific": "model-specific data",
    "loss_scale": "a loss scale (GradScaler)", "output": "the command's output", "step_time": "step times",
    "memory": "memory samples", "device_memory": "device memory samples", "checkpoints": "checkpoints",
    "experts": "expert loads (MoE)",
    "sched_horizon": "the schedule's length (total_steps in watch() and a scheduler whose horizon and step count are readable)",
}


@dataclass
class Check:
    code: str
    name: str
    family: str
    result: str  # "found" | "passed" | "not checked"
    detail: str


def available(data: RunData) -> set[str]:
    have = set()
    for name in ("lr", "loss", "grad_norm", "update_ratio", "data_wait", "step_time", "loss_scale"):
        if data.col(name) is not None:
            have.add(name)
    samples = [e["data"] for e in data.events if e["kind"] == "sample" and e["name"] == "memory"
               and isinstance(e["data"], dict)]
    if samples or any(any(w in k.lower() for w in ("mem", "rss")) for k in data.extra):
        have.add("memory")
    if any("dev_allocated" in s or "dev_total" in s for s in samples):
        have.add("device_memory")
    if data.events_of("checkpoint"):
        have.add("checkpoints")
    if data.events_of("experts"):
        have.add("experts")
    if (data.run_dir / "output.log").is_file():
        have.add("output")
    if data.n_steps:
        have.add("steps")
        have.add("probe")
    if data.parts:
        have.add("parts")
    if data.weights:
        have.add("weights")
    if data.events_of("eval"):
        have.add("eval")
    if data.events_of("probe"):
        have.add("probe")
    if len([r for r in data.ranks if r >= 0]) > 1:
        have.add("ranks")
    watchdog = data.meta.get("watchdog") or {}
    if watchdog or data.status.get("watched_by") == "watchdog":
        have.add("watchdog")
    if watchdog.get("expects"):
        have.add("expects")
    if data.status.get("state") not in (None, "running"):
        have.add("process")
    plan = data.meta.get("plan") or {}
    if plan.get("total_steps") and plan.get("sched_horizon") and plan.get("sched_counted", True) is not False:
        have.add("sched_horizon")  # without it TG102 only asks whether a warmup outlasts half the run
    if data.schedule or data.events_of("preflight") or data.meta.get("preflight"):
        have.add("preflight")
    return have


def build_checks(data: RunData) -> list[Check]:
    from trainguard.rules.catalog import CATALOG

    have = available(data)
    found: dict[str, Any] = {}
    for f in data.findings:
        found.setdefault(f.code, f)
    out = []
    for entry in CATALOG:
        if entry.status == "removed":
            continue
        needs = tuple(getattr(entry, "needs", None) or CODE_NEEDS.get(entry.code) or FAMILY_NEEDS.get(entry.code[2], ()))
        if entry.code in found:
            f = found[entry.code]
            at = f" at step {f.step}" if f.step is not None else ""
            out.append(Check(entry.code, entry.name, entry.family, "found", f"found{at}: see the finding"))
            continue
        missing = [n for n in needs if n not in have]
        if missing:
            words = ", ".join(DATA_WORDS.get(n, n) for n in missing)
            out.append(Check(entry.code, entry.name, entry.family, "not checked", f"needs {words}"))
        else:
            words = ", ".join(DATA_WORDS.get(n, n) for n in needs) or "the run"
            out.append(Check(entry.code, entry.name, entry.family, "passed", f"checked on {words}"))
    return out
