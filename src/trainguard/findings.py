"""A finding: one thing trainguard is sure went wrong (or is worth knowing), with its evidence.

Every part of trainguard speaks in findings: the watchdog (crashes, hangs, missing artifacts), the
rules (silent failures), preflight and `check`. A finding is a plain dataclass that round-trips
through JSON, so the run folder, status.json and the report all hold the same thing.

A finding without evidence is not shown (DESIGN.md): `evidence` is a dict of the numbers, frames or
lines that support it, and `fix` says what to change.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

SEVERITIES = ("info", "warning", "error")
_SEVERITY_RANK = {name: rank for rank, name in enumerate(SEVERITIES)}


@dataclass(kw_only=True)
class Finding:
    code: str
    """Stable rule code, e.g. "TG101". A code is never reused."""
    name: str
    """Kebab-case name of the pattern flagged, e.g. "lr-reaches-zero"."""
    severity: str
    """One of "info", "warning", "error"."""
    summary: str
    """One sentence stating the problem with the run's own numbers."""
    evidence: dict[str, Any] = field(default_factory=dict)
    """The numbers, frames or lines behind the finding."""
    fix: str = ""
    """What to change."""
    step: int | None = None
    """Optimizer step where the problem starts (None when it has no step, e.g. a config finding)."""
    t: float | None = None
    """Unix time when it was found."""
    cause: str | None = None
    """Short cause label where the rule has one (hang causes, crash signatures)."""
    where: str | None = None
    """file:line (function) of the innermost frame in the user's code, where there is one."""
    exception: str | None = None
    """Exception type name, for crash findings."""
    source: str = "trainguard"
    """What produced it: "watchdog", "probe", "rules", "preflight", "check", "diagnose"."""

    def __post_init__(self) -> None:
        if self.severity not in _SEVERITY_RANK:
            raise ValueError(f"finding severity must be one of {SEVERITIES}, got {self.severity!r}")

    @classmethod
    def of(cls, rule: Declared, *, severity: str | None = None, **fields: Any) -> Finding:
        """A finding of the declared rule: its code and name, its severity unless this one differs."""
        return cls(code=rule.code, name=rule.name, severity=severity or rule.severity, **fields)

    @property
    def rank(self) -> int:
        return _SEVERITY_RANK[self.severity]

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        # Optional fields stay out of status.json when empty, so readers see only what is known.
        for key in ("cause", "where", "exception", "t"):
            if data[key] is None:
                del data[key]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Finding:
        """A finding from its stored form (status.json, the store's events): TypeError or ValueError for
        anything that is not one, field by field (a damaged run folder is untrusted input)."""
        if not isinstance(data, dict):
            raise TypeError(f"a finding is an object, not {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        fields = {k: v for k, v in data.items() if k in known}
        for key in ("code", "name", "severity", "summary"):
            if not isinstance(fields.get(key), str):
                raise TypeError(f"a finding's {key} is text")
        for key in ("fix", "source"):
            if key in fields and not isinstance(fields[key], str):
                fields[key] = str(fields[key])
        for key in ("cause", "where", "exception"):
            if fields.get(key) is not None and not isinstance(fields[key], str):
                fields[key] = str(fields[key])
        if not isinstance(fields.get("evidence", {}), dict):
            fields["evidence"] = {"value": fields["evidence"]}
        step, t = fields.get("step"), fields.get("t")
        if step is not None and (isinstance(step, bool) or not isinstance(step, int) or not -2**62 < step < 2**62):
            fields["step"] = None
        if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or not -1e15 < t < 1e15):
            fields["t"] = None
        return cls(**fields)

    def one_line(self) -> str:
        at = f" at step {self.step}" if self.step is not None else ""
        return f"{self.code} {self.name} [{self.severity}]{at}: {self.summary}"


@dataclass(frozen=True)
class Data:
    """A kind of data a rule reads. A rule's `needs` names these, so `trainguard diagnose` can say which rules a
    log could not feed and the report which checks the run's data allowed, from the rule itself."""

    key: str
    words: str
    """How the report names it: "needs the learning rate"."""
    label: str = ""
    """How `trainguard diagnose` lists it when a log lacks it (the key when empty)."""
    in_logs: bool = False
    """A log reader can put it in an event stream; a rule that needs anything else is not fed on a log."""

    def __post_init__(self) -> None:
        if not self.label:
            object.__setattr__(self, "label", self.key)


# -- the data rules read: what the probe records (the first group is also what a log can carry) ------------
LR = Data("lr", "the learning rate", in_logs=True)
LOSS = Data("loss", "the loss", in_logs=True)
GRAD_NORM = Data("grad_norm", "gradient norms", in_logs=True)
PARTS = Data("parts", "loss parts", in_logs=True)
EVAL = Data("eval", "evaluations", in_logs=True)
CHECKPOINTS = Data("checkpoints", "checkpoints", "checkpoint", in_logs=True)
OUTPUT = Data("output", "the command's output", "output line counts", in_logs=True)
UPDATE_RATIO = Data("update_ratio", "update ratios")
LOSS_SCALE = Data("loss_scale", "a loss scale (GradScaler)")
WEIGHTS = Data("weights", "loss-part weights")
STEP_TIME = Data("step_time", "step times")
DATA_WAIT = Data("data_wait", "data-wait times")
MEMORY = Data("memory", "memory samples", "memory samples")
DEVICE_MEMORY = Data("device_memory", "device memory samples", "memory samples")
EXPERTS = Data("experts", "expert loads (MoE)", "expert loads")
OUTPUT_SIZE = Data("output_size", "the model's output size (output_size in watch())")
SCHED_HORIZON = Data("sched_horizon", "the schedule's length (total_steps in watch() and a scheduler whose horizon "
                                      "and step count are readable)", "sched_epoch")
PROBE = Data("probe", "the probe", "optimizer wiring (probe only)")
# the model the forward contracts (TG214...) hook: handed to `watch(model, ...)`, or found by the automatic
# probe through torch's global module hooks as the module its optimizer trains (probe/modulesight.py)
MODEL = Data("model", "the model (watch(model, ...), or found by the automatic probe)")
# ... and its loss handed to `guard.step(loss)` beside it (the loss-broadcast check compares the two)
MODEL_LOSS = Data("model_loss", "the model's output and its loss (watch(model, ...) and guard.step(loss))")
STEPS = Data("steps", "probe steps")
CHECKPOINT_CHECKS = Data("checkpoint_checks", "checkpoint verifications (of the checkpoints the run reported)")
DEVICE = Data("device", "device telemetry (nvidia-ml-py, a GPU)")
RANKS = Data("ranks", "more than one rank")
NODES = Data("nodes", "more than one node (torchrun --nnodes)")
# -- ... and what only the watchdog or preflight knows
WATCHDOG = Data("watchdog", "the watchdog")
PROCESS = Data("process", "the process's exit")
EXPECTS = Data("expects", "expected artifacts (--expect)")
PREFLIGHT = Data("preflight", "a preflight run")


class Declared(Protocol):
    """What declares a finding code: a `Code` beside the function that builds its findings, or a rule class
    of the engine (`rules.engine.Rule`), whose docstring is its page."""

    @property
    def code(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def severity(self) -> str: ...
    @property
    def needs(self) -> tuple[Data, ...]: ...
    @property
    def status(self) -> str: ...
    @property
    def since(self) -> str: ...


@dataclass(frozen=True)
class Code:
    """One finding code, declared once beside the function that builds its findings (ruff's rule, for trainguard).

        def killed_finding(...) -> Finding:
            \"\"\"TG503 run-killed: ... (the page)\"\"\"
            return Finding.of(RUN_KILLED, summary=..., ...)

        RUN_KILLED = Code("TG503", "run-killed", "error", needs=(PROCESS,), page=killed_finding)

    Everything else that names the code imports the declaration. A code is never reused; a retired one
    stays declared with status "removed".
    """

    code: str
    name: str
    severity: str
    needs: tuple[Data, ...] = ()
    """What the rule reads: without it the rule could not run (not "found nothing")."""
    page: Callable[..., Any] | type | None = None
    """The function or class whose docstring is the rule's page ("What it detects / Why it matters / ...")."""
    status: str = "stable"  # preview | stable | deprecated | removed
    since: str = "0.1.0"
    STATUSES: ClassVar[tuple[str, ...]] = ("preview", "stable", "deprecated", "removed")

    def __post_init__(self) -> None:
        if self.severity not in _SEVERITY_RANK or self.status not in self.STATUSES:
            raise ValueError(f"{self.code}: bad severity {self.severity!r} or status {self.status!r}")


def most_severe_first(findings: list[Finding]) -> list[Finding]:
    """Errors before warnings before info; within a severity, earliest step first."""
    return sorted(findings, key=lambda f: (-f.rank, f.step if f.step is not None else -1))



def same_finding(a: Finding, b: Finding) -> bool:
    """One problem told twice (what a run recorded, and the same rule re-read from its store or its log):
    the same rule, at the same step or of the same cause."""
    return a.code == b.code and a.name == b.name and (a.step == b.step or (a.cause is not None and a.cause == b.cause))


def merged(first: list[Finding], *more: list[Finding]) -> list[Finding]:
    """`first`'s findings, then those of `more` that none before them already tells (`same_finding`)."""
    out = list(first)
    for group in more:
        out += [f for f in group if not any(same_finding(f, g) for g in out)]
    return out


def escalations_merged(findings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Findings (as in status.json) with one entry per code where a rule escalated: a warning, then an error.

    A rate rule warns at the first occurrence and raises an error once the rate passes its limit; both
    are true, but status.json listing TG301 twice (warning, error) reads as two problems. The most severe
    one stays (the first at that severity); the lesser ones' summaries and evidence go into its evidence
    under "earlier". Findings of one code at one severity (two paths, two keys) stay apart.
    """
    def rank(f: dict[str, Any]) -> int:
        return _SEVERITY_RANK.get(f.get("severity") or "", 0)

    by_code: dict[Any, list[dict[str, Any]]] = {}
    for f in findings:
        by_code.setdefault(f.get("code"), []).append(f)
    out: list[dict[str, Any]] = []
    for f in findings:
        same = by_code[f.get("code")]
        if f.get("code") is None or len({rank(x) for x in same}) < 2:
            out.append(f)
            continue
        top = max(rank(x) for x in same)
        keeper = next(x for x in same if rank(x) == top)
        if f is keeper:
            earlier = [{"severity": x.get("severity"), "step": x.get("step"), "summary": x.get("summary"),
                        "evidence": x.get("evidence")} for x in same if rank(x) < top]
            evidence = f.get("evidence")
            evidence = evidence if isinstance(evidence, dict) else {} if evidence is None else {"value": evidence}
            merged = {**evidence, "earlier": earlier}
            # the problem was first detected by the lesser finding: the merged one keeps that moment
            detected = [x["evidence"]["detected_step"] for x in same
                        if isinstance(x.get("evidence"), dict)
                        and isinstance(x["evidence"].get("detected_step"), (int, float))]
            if detected:
                merged["detected_step"] = min(detected)
            out.append({**f, "evidence": merged})
        elif rank(f) == top:
            out.append(f)
    return out
