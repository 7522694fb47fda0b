"""The health rules: silent failures found while the run trains, the list the engine runs.

In catalogue order (`trainguard rules` lists them in this order, after the watchdog's own codes). A new
rule is a class in one of the rule modules and one line here.
"""

from __future__ import annotations

from trainguard.rules.checkpoints import CHECKPOINT_RULES
from trainguard.rules.composition import (
    LossPartsDontSum,
    LossPartsImbalanced,
    LossPartVanished,
    LossWeightStalled,
)
from trainguard.rules.contracts import (
    EvalBeforeTrainInit,
    EvalInTrainMode,
    EvalNotDeterministic,
    FrozenParamsUpdated,
    GradsNeverReset,
    StepUpdatesNothing,
    TrainInEvalMode,
)
from trainguard.rules.contracts_data import (
    AutocastRunsFp32,
    BatchDimLost,
    LossBroadcastsBatch,
    ReplicasDiverged,
    WorkersShareRng,
)
from trainguard.rules.devices import DEVICE_RULES
from trainguard.rules.divergence import LossDiverged, LossDiverging, LossSpike
from trainguard.rules.evalfrozen import EvalMetricsFrozen
from trainguard.rules.lossfall import LossNotDecreasing
from trainguard.rules.lossscale import InitialLossOff
from trainguard.rules.memory import DeviceMemoryNearFull, MemoryCreep
from trainguard.rules.model import ExpertCollapse, PerplexityImplausible
from trainguard.rules.numerics import ClipBeforeUnscale, GradScalerCollapse, NonfiniteGrad, NonfiniteLoss
from trainguard.rules.overfit import EvalLossRising
from trainguard.rules.process import CheckpointStale, DataWaitDominant, LogFlood, ThroughputDrop
from trainguard.rules.progress import ParamsWithoutGrad, WeightsNotUpdating
from trainguard.rules.ranks import GradNormsDiffer, NonfiniteOnOneRank, RankStopped, StragglerRank
from trainguard.rules.rule import Rule
from trainguard.rules.schedule import (
    LrCyclesToZero,
    LrReachesZero,
    LrRestartsAtResume,
    ScheduleHorizonMismatch,
)

HEALTH_RULES: list[type[Rule]] = [
    # TG1xx schedule and LR, TG2xx learning progress, TG3xx numerics, TG4xx loss composition
    LrReachesZero, ScheduleHorizonMismatch, LrCyclesToZero, LrRestartsAtResume,
    WeightsNotUpdating, ParamsWithoutGrad, EvalMetricsFrozen, LossNotDecreasing, InitialLossOff, LossDiverging,
    LossSpike, LossDiverged, EvalLossRising,
    NonfiniteLoss, NonfiniteGrad, GradScalerCollapse, ClipBeforeUnscale,
    LossPartsImbalanced, LossPartVanished, LossPartsDontSum, LossWeightStalled,
    # TG52x process (TG501-509, crashes, hangs and artifacts, are the watchdog's)
    LogFlood, ThroughputDrop, DataWaitDominant, MemoryCreep, DeviceMemoryNearFull, CheckpointStale,
    # TG56x checkpoints verified while the run goes on (issue 37, rules/checkpoints.py)
    *CHECKPOINT_RULES,
    # TG57x device faults beside the symptoms (issue 37, rules/devices.py)
    *DEVICE_RULES,
    # API contracts broken by the training code, seen by the probe (probe/contracts.py)
    StepUpdatesNothing, FrozenParamsUpdated, GradsNeverReset, EvalInTrainMode, EvalBeforeTrainInit,
    EvalNotDeterministic, TrainInEvalMode, AutocastRunsFp32, WorkersShareRng, LossBroadcastsBatch, BatchDimLost, ReplicasDiverged,
    # TG702-TG709 across ranks (TG711-TG719: hangs across ranks and nodes, the watchdog's)
    NonfiniteOnOneRank, StragglerRank, GradNormsDiffer, RankStopped,
    # TG81x model-specific (TG801-810 are the distillation recipe's)
    ExpertCollapse, PerplexityImplausible,
]
