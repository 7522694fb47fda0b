"""The catalogue: every finding code trainguard can produce, one line each (ruff's codes.rs, for trainguard).

Each code is declared once, beside what finds it: a rule class of the engine (rules/), or a `Code` next to
the function that builds its findings (the watchdog, preflight, `check`, log readers). The declaration
carries the code, name, severity, status, the data it needs and its page: the docstring of that class or
function ("What it detects / Why it matters / Example / What to change"). This list only imports them, in
the order `trainguard rules` prints. A code is never reused; a retired rule stays declared with status
"removed".

Families: TG1xx schedule and LR, TG2xx learning progress, TG3xx numerics, TG4xx loss composition,
TG5xx process, hang and data, TG6xx configuration, TG7xx distributed, TG8xx model-specific.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

from trainguard.errors import UserError
from trainguard.findings import Code, Data, Declared
from trainguard.ingest.signs import LOG_ENDS_UNFINISHED, SCHEDULER_BEFORE_OPTIMIZER
from trainguard.preflight.configrules import (
    IMPLAUSIBLE_VALUE,
    INTERVAL_DOMINATES_RUN,
    INTERVAL_EXCEEDS_RUN,
    MAX_STEPS_COUNTS_MICRO_BATCHES,
    PATIENCE_TOO_SHORT,
    SCHEDULE_IGNORES_ACCUMULATION,
    SCHEDULE_LENGTH_MISMATCH,
    WARMUP_EXCEEDS_RUN,
    WARMUP_IGNORED,
)
from trainguard.preflight.runrules import (
    CHECKPOINT_RESUME_FAILED,
    PERIODIC_PATH_CRASHED,
    PERIODIC_PATH_DOMINATES,
    PERIODIC_PATH_NEVER_RUNS,
    PREFLIGHT_TIMED_OUT,
    SECOND_EPOCH_FAILED,
    WROTE_OUTSIDE_SCRATCH,
)
from trainguard.preflight.schedule import SCHEDULE_ENDS_EARLY, SCHEDULE_ENDS_LATE
from trainguard.rules.crash import RUN_CRASHED
from trainguard.rules.devices import DEVICE_EVENT_NOTED
from trainguard.rules.ending import PROBE_NOT_FINISHED, RUN_KILLED
from trainguard.rules.health import HEALTH_RULES
from trainguard.rules.scheduler import CUT_BY_SCHEDULER, NODE_LOST
from trainguard.watchdog.joblimit import PLAN_EXCEEDS_TIME_LIMIT
from trainguard.watchdog.rendezvous import RENDEZVOUS_INCOMPLETE
from trainguard.watchdog.restart import HANG_REPEATS
from trainguard.watchdog.stall import RUN_HUNG, RUN_STALLED
from trainguard.watchdog.verdict import (
    ARTIFACT_MISSING,
    ARTIFACT_STALE,
    LEFTOVER_PROCESSES,
)

FAMILIES = {
    "1": "schedule and LR", "2": "learning progress", "3": "numerics", "4": "loss composition",
    "5": "process, hang and data", "6": "configuration", "7": "distributed", "8": "model-specific",
}


@dataclass(frozen=True)
class RuleEntry:
    """One line of the catalogue: a declaration, read the same way whether it is a rule class or a `Code`."""

    rule: Declared

    @property
    def code(self) -> str:
        return self.rule.code

    @property
    def name(self) -> str:
        return self.rule.name

    @property
    def severity(self) -> str:
        return self.rule.severity

    @property
    def status(self) -> str:
        return self.rule.status

    @property
    def since(self) -> str:
        return self.rule.since

    @property
    def needs(self) -> tuple[Data, ...]:
        return self.rule.needs

    @property
    def family(self) -> str:
        return FAMILIES.get(self.code[2], "other")

    def resolve(self) -> object:
        """The function or class whose docstring is the rule's page."""
        return self.rule.page if isinstance(self.rule, Code) else self.rule

    def doc(self) -> str:
        text = inspect.getdoc(self.resolve()) or ""
        first, _, rest = text.partition("\n")
        # the first line repeats "CODE name: summary"; the page is the rest
        return rest.strip() if first.startswith(self.code) else text

    def headline(self) -> str:
        first = (inspect.getdoc(self.resolve()) or "").partition("\n")[0]
        return first.split(":", 1)[1].strip() if ":" in first else first


_DECLARED: list[Declared] = [
    # the run's ending and its stalls, judged by the watchdog (issue 2) or the probe running alone
    RUN_CRASHED, RUN_HUNG, RUN_KILLED, ARTIFACT_MISSING, ARTIFACT_STALE, PROBE_NOT_FINISHED, RUN_STALLED,
    # health rules (issue 4) and API contracts (issue 20): silent failures found while the run trains.
    # TG702-TG709: cross-rank health rules (issue 16, rules/ranks.py); TG711-TG719: hangs across ranks and
    # nodes (issue 16, the watchdog)
    *HEALTH_RULES,
    # device events with no symptom (issue 37, rules/devices.py; TG571 device-fault is a health rule)
    DEVICE_EVENT_NOTED,
    # a node of a multi-node job lost (issue 16, the watchdog); a start-up waiting for ranks never started (issue 31)
    NODE_LOST, RENDEZVOUS_INCOMPLETE,
    LEFTOVER_PROCESSES,
    # the job scheduler (issue 34): a plan that cannot fit the job's time limit, a run the scheduler cut
    PLAN_EXCEEDS_TIME_LIMIT, CUT_BY_SCHEDULER,
    # hang and crash diagnosis (issue 3)
    HANG_REPEATS,
    # preflight and config check (issue 5): `trainguard preflight` (TG601-609), `trainguard check` (TG611-619)
    PERIODIC_PATH_CRASHED, CHECKPOINT_RESUME_FAILED, SECOND_EPOCH_FAILED, SCHEDULE_ENDS_EARLY, SCHEDULE_ENDS_LATE,
    PERIODIC_PATH_NEVER_RUNS, PERIODIC_PATH_DOMINATES, WROTE_OUTSIDE_SCRATCH, PREFLIGHT_TIMED_OUT,
    SCHEDULE_IGNORES_ACCUMULATION, SCHEDULE_LENGTH_MISMATCH, WARMUP_EXCEEDS_RUN, INTERVAL_EXCEEDS_RUN,
    INTERVAL_DOMINATES_RUN, PATIENCE_TOO_SHORT, IMPLAUSIBLE_VALUE, WARMUP_IGNORED, MAX_STEPS_COUNTS_MICRO_BATCHES,
    # integrations and ingest (issue 8): what a log alone shows, for `trainguard diagnose PATH`
    SCHEDULER_BEFORE_OPTIMIZER, LOG_ENDS_UNFINISHED,
]
CATALOG: list[RuleEntry] = [RuleEntry(rule) for rule in _DECLARED]


def lookup(key: str) -> RuleEntry:
    k = key.strip()
    for entry in CATALOG:
        if entry.code.lower() == k.lower() or entry.name == k.lower():
            return entry
    raise UserError(f"unknown rule: {key} (see `trainguard rules` for the list)")
