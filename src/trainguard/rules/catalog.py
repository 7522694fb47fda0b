"""The single code → rule table (ruff's codes.rs, for trainguard).

Each entry names where the rule's page lives: the docstring of the function or class that produces the
finding ("What it detects / Why it matters / Example / What to change"). A code is never reused; a
retired rule stays listed with status "removed".

Families: TG1xx schedule and LR, TG2xx learning progress, TG3xx numerics, TG4xx loss composition,
TG5xx process, hang and data, TG6xx configuration, TG7xx distributed, TG8xx model-specific.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass

from trainguard.errors import UserError

FAMILIES = {
    "1": "schedule and LR", "2": "learning progress", "3": "numerics", "4": "loss composition",
    "5": "process, hang and data", "6": "configuration", "7": "distributed", "8": "model-specific",
}


@dataclass(frozen=True)
class RuleEntry:
    code: str
    name: str
    severity: str
    status: str  # preview | stable | deprecated | removed
    since: str
    target: str  # "module:attribute" whose docstring is the rule's page

    @property
    def family(self) -> str:
        return FAMILIES.get(self.code[2], "other")

    def resolve(self) -> object:
        """The function or class the target names (its docstring is the page)."""
        module, _, attr = self.target.partition(":")
        obj = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
        return obj

    def doc(self) -> str:
        text = inspect.getdoc(self.resolve()) or ""
        first, _, rest = text.partition("\n")
        # the first line repeats "CODE name: summary"; the page is the rest
        return rest.strip() if first.startswith(self.code) else text

    def headline(self) -> str:
        first = (inspect.getdoc(self.resolve()) or "").partition("\n")[0]
        return first.split(":", 1)[1].strip() if ":" in first else first


_R = "trainguard.rules"

CATALOG: list[RuleEntry] = [
    RuleEntry("TG501", "run-crashed", "error", "stable", "0.1.0", "trainguard.watchdog.crash:crash_finding"),
    RuleEntry("TG502", "run-hung", "error", "stable", "0.1.0", "trainguard.watchdog.stall:hang_finding"),
    RuleEntry("TG503", "run-killed", "error", "stable", "0.1.0", "trainguard.watchdog.verdict:killed_finding"),
    RuleEntry("TG504", "artifact-missing", "error", "stable", "0.1.0", "trainguard.watchdog.verdict:check_artifacts"),
    RuleEntry("TG505", "artifact-stale", "error", "stable", "0.1.0", "trainguard.watchdog.verdict:check_artifacts"),
    RuleEntry("TG506", "probe-not-finished", "error", "stable", "0.1.0", "trainguard.watchdog.verdict:probe_not_finished"),
    RuleEntry("TG509", "run-stalled", "warning", "stable", "0.1.0", "trainguard.watchdog.stall:stalled_finding"),
    # -- health rules (issue 4): silent failures found while the run trains; the engine runs every
    # entry below whose target is a `trainguard.rules.engine.Rule` class. TG52x and TG81x leave the
    # low numbers of those families to the hang and distillation areas.
    RuleEntry("TG101", "lr-reaches-zero", "error", "stable", "0.1.0", f"{_R}.schedule:LrReachesZero"),
    RuleEntry("TG102", "schedule-horizon-mismatch", "warning", "stable", "0.1.0",
              f"{_R}.schedule:ScheduleHorizonMismatch"),
    RuleEntry("TG103", "lr-cycles-to-zero", "error", "preview", "0.1.0", f"{_R}.schedule:LrCyclesToZero"),
    RuleEntry("TG201", "weights-not-updating", "error", "stable", "0.1.0", f"{_R}.progress:WeightsNotUpdating"),
    RuleEntry("TG202", "params-without-grad", "warning", "stable", "0.1.0", f"{_R}.progress:ParamsWithoutGrad"),
    RuleEntry("TG203", "eval-metrics-frozen", "error", "stable", "0.1.0", f"{_R}.progress:EvalMetricsFrozen"),
    RuleEntry("TG204", "loss-not-decreasing", "warning", "stable", "0.1.0", f"{_R}.progress:LossNotDecreasing"),
    RuleEntry("TG205", "initial-loss-off", "warning", "stable", "0.1.0", f"{_R}.progress:InitialLossOff"),
    RuleEntry("TG206", "loss-diverging", "error", "stable", "0.1.0", f"{_R}.progress:LossDiverging"),
    RuleEntry("TG207", "loss-spike", "warning", "stable", "0.1.0", f"{_R}.progress:LossSpike"),
    RuleEntry("TG301", "nonfinite-loss", "warning", "stable", "0.1.0", f"{_R}.numerics:NonfiniteLoss"),
    RuleEntry("TG302", "nonfinite-grad", "warning", "stable", "0.1.0", f"{_R}.numerics:NonfiniteGrad"),
    RuleEntry("TG303", "grad-scaler-collapse", "error", "stable", "0.1.0", f"{_R}.numerics:GradScalerCollapse"),
    RuleEntry("TG401", "loss-parts-imbalanced", "warning", "stable", "0.1.0",
              f"{_R}.composition:LossPartsImbalanced"),
    RuleEntry("TG402", "loss-part-vanished", "warning", "stable", "0.1.0", f"{_R}.composition:LossPartVanished"),
    RuleEntry("TG403", "loss-parts-dont-sum", "warning", "stable", "0.1.0", f"{_R}.composition:LossPartsDontSum"),
    RuleEntry("TG404", "loss-weight-stalled", "warning", "stable", "0.1.0", f"{_R}.composition:LossWeightStalled"),
    RuleEntry("TG521", "log-flood", "warning", "stable", "0.1.0", f"{_R}.process:LogFlood"),
    RuleEntry("TG522", "throughput-drop", "warning", "stable", "0.1.0", f"{_R}.process:ThroughputDrop"),
    RuleEntry("TG523", "data-wait-dominant", "warning", "stable", "0.1.0", f"{_R}.process:DataWaitDominant"),
    RuleEntry("TG524", "memory-creep", "warning", "stable", "0.1.0", f"{_R}.process:MemoryCreep"),
    RuleEntry("TG525", "device-memory-near-full", "warning", "stable", "0.1.0",
              f"{_R}.process:DeviceMemoryNearFull"),
    RuleEntry("TG526", "checkpoint-stale", "warning", "stable", "0.1.0", f"{_R}.process:CheckpointStale"),
    # -- API contracts broken by the training code (issue 20): seen by the probe (probe/contracts.py)
    RuleEntry("TG211", "step-updates-nothing", "error", "preview", "0.1.0", f"{_R}.contracts:StepUpdatesNothing"),
    RuleEntry("TG212", "frozen-params-updated", "error", "preview", "0.1.0", f"{_R}.contracts:FrozenParamsUpdated"),
    RuleEntry("TG213", "grads-never-reset", "error", "preview", "0.1.0", f"{_R}.contracts:GradsNeverReset"),
    RuleEntry("TG214", "eval-in-train-mode", "warning", "preview", "0.1.0", f"{_R}.contracts:EvalInTrainMode"),
    RuleEntry("TG215", "eval-before-train-init", "warning", "preview", "0.1.0", f"{_R}.contracts:EvalBeforeTrainInit"),
    RuleEntry("TG216", "eval-not-deterministic", "warning", "preview", "0.1.0", f"{_R}.contracts:EvalNotDeterministic"),
    RuleEntry("TG311", "autocast-runs-fp32", "warning", "preview", "0.1.0", f"{_R}.contracts:AutocastRunsFp32"),
    RuleEntry("TG541", "workers-share-rng", "warning", "preview", "0.1.0", f"{_R}.contracts:WorkersShareRng"),
    RuleEntry("TG542", "loss-broadcasts-batch", "error", "preview", "0.1.0", f"{_R}.contracts:LossBroadcastsBatch"),
    RuleEntry("TG543", "batch-dim-lost", "warning", "preview", "0.1.0", f"{_R}.contracts:BatchDimLost"),
    RuleEntry("TG701", "replicas-diverged", "error", "preview", "0.1.0", f"{_R}.contracts:ReplicasDiverged"),
    # TG702-TG709: cross-rank health rules (issue 16, rules/ranks.py); TG711-TG719: hangs across ranks and
    # nodes (issue 16, the watchdog)
    RuleEntry("TG702", "nonfinite-on-one-rank", "error", "preview", "0.1.0", f"{_R}.ranks:NonfiniteOnOneRank"),
    RuleEntry("TG703", "straggler-rank", "warning", "preview", "0.1.0", f"{_R}.ranks:StragglerRank"),
    RuleEntry("TG704", "grad-norms-differ", "error", "preview", "0.1.0", f"{_R}.ranks:GradNormsDiffer"),
    RuleEntry("TG705", "rank-stopped", "error", "preview", "0.1.0", f"{_R}.ranks:RankStopped"),
    RuleEntry("TG711", "node-lost", "error", "preview", "0.1.0", "trainguard.watchdog.nodes:node_lost_finding"),
    RuleEntry("TG811", "expert-collapse", "warning", "stable", "0.1.0", f"{_R}.model:ExpertCollapse"),
    RuleEntry("TG812", "perplexity-implausible", "warning", "stable", "0.1.0", f"{_R}.model:PerplexityImplausible"),
    RuleEntry("TG508", "leftover-processes", "warning", "stable", "0.1.0", "trainguard.watchdog.verdict:leftover_finding"),
    # hang and crash diagnosis (issue 3)
    RuleEntry("TG507", "hang-repeats", "error", "stable", "0.1.0", "trainguard.watchdog.restart:repeats_finding"),
    # -- preflight and config check (issue 5): `trainguard preflight` (TG601-609), `trainguard check` (TG611-618)
    RuleEntry("TG601", "periodic-path-crashed", "error", "preview", "0.1.0", "trainguard.preflight.judge:path_crashed"),
    RuleEntry("TG602", "checkpoint-resume-failed", "error", "preview", "0.1.0", "trainguard.preflight.judge:resume_failed"),
    RuleEntry("TG603", "second-epoch-failed", "error", "preview", "0.1.0", "trainguard.preflight.judge:second_epoch_failed"),
    RuleEntry("TG604", "schedule-ends-early", "error", "preview", "0.1.0", "trainguard.preflight.schedule:schedule_ends_early"),
    RuleEntry("TG605", "schedule-ends-late", "error", "preview", "0.1.0", "trainguard.preflight.schedule:schedule_ends_late"),
    RuleEntry("TG606", "periodic-path-never-runs", "error", "preview", "0.1.0", "trainguard.preflight.judge:path_never_runs"),
    RuleEntry("TG607", "periodic-path-dominates", "warning", "preview", "0.1.0", "trainguard.preflight.judge:path_dominates"),
    RuleEntry("TG608", "wrote-outside-scratch", "warning", "preview", "0.1.0", "trainguard.preflight.judge:wrote_outside"),
    RuleEntry("TG609", "preflight-timed-out", "error", "preview", "0.1.0", "trainguard.preflight.judge:timed_out"),
    RuleEntry("TG611", "schedule-ignores-accumulation", "error", "preview", "0.1.0", "trainguard.preflight.check:schedule_length"),
    RuleEntry("TG612", "schedule-length-mismatch", "error", "preview", "0.1.0", "trainguard.preflight.check:schedule_length_mismatch"),
    RuleEntry("TG613", "warmup-exceeds-run", "error", "preview", "0.1.0", "trainguard.preflight.check:warmup"),
    RuleEntry("TG614", "interval-exceeds-run", "error", "preview", "0.1.0", "trainguard.preflight.check:intervals"),
    RuleEntry("TG615", "interval-dominates-run", "warning", "preview", "0.1.0", "trainguard.preflight.check:interval_dominates"),
    RuleEntry("TG616", "patience-too-short", "error", "preview", "0.1.0", "trainguard.preflight.check:patience"),
    RuleEntry("TG617", "implausible-value", "error", "preview", "0.1.0", "trainguard.preflight.check:implausible"),
    RuleEntry("TG618", "warmup-ignored", "warning", "preview", "0.1.0", "trainguard.preflight.check:warmup_ignored"),
    RuleEntry("TG619", "max-steps-counts-micro-batches", "error", "preview", "0.1.0",
              "trainguard.preflight.check:max_steps_counts_micro"),
    # integrations and ingest (issue 8): what a log alone shows, for `trainguard diagnose PATH`
    RuleEntry("TG151", "scheduler-before-optimizer", "warning", "stable", "0.1.0",
              "trainguard.ingest.signs:scheduler_before_optimizer"),
    RuleEntry("TG531", "log-ends-unfinished", "warning", "stable", "0.1.0", "trainguard.ingest.signs:log_ends_unfinished"),
]


def lookup(key: str) -> RuleEntry:
    k = key.strip()
    for entry in CATALOG:
        if entry.code.lower() == k.lower() or entry.name == k.lower():
            return entry
    raise UserError(f"unknown rule: {key} (see `trainguard rules` for the list)")
