"""The contract between trainguard's rooms: what the probe, the watchdog, preflight and the readers agree on.

Everything that crosses a room boundary is named here once: the environment variables one process hands
the next, the kinds of event in the run store, the heartbeat's fields, the step rows and events the rules
read, and status.json. The rooms import these names; none of them defines its own.

This module is the bottom of the import graph: it imports nothing of the project and, when the program
runs, nothing at all. The start-up bootstrap of `trainguard run` loads it into every Python process of a
watched command (see probe/auto.py), where importing `typing` would cost tens of milliseconds; the types
below exist for type checkers only (`TYPE_CHECKING` is false when the program runs) and are used in
annotations, which `from __future__ import annotations` leaves unevaluated.
"""

from __future__ import annotations

TYPE_CHECKING = False  # type checkers treat any `TYPE_CHECKING` as true

# -- environment: how `trainguard run` / preflight talk to the processes they start -------------------

ENV_RUN_DIR = "TRAINGUARD_RUN_DIR"  # the run folder the probe joins (set by `trainguard run`)
ENV_RUNS_ROOT = "TRAINGUARD_RUNS_ROOT"  # where new run folders go (default ./trainguard-runs)
ENV_WATCHDOG = "TRAINGUARD_WATCHDOG"  # set: a watchdog owns status.json and runs the rules; the probe records
ENV_ATTEMPT = "TRAINGUARD_ATTEMPT"  # which start of the command this is (0, then 1, 2... after restarts)
ENV_RESUME_FROM = "TRAINGUARD_RESUME_FROM"  # the checkpoint a restarted (or preflight-resumed) script loads
ENV_DISABLE = "TRAINGUARD_DISABLE"  # set: `watch()` returns a do-nothing guard, no automatic probe
ENV_RULES = "TRAINGUARD_RULES"  # "0": a probe running alone does not run the health rules itself
ENV_PREFLIGHT = "TRAINGUARD_PREFLIGHT"  # JSON of a preflight start (mode, steps, scratch); never set by hand
ENV_AUTO = "TRAINGUARD_AUTO"  # "0": no start-up bootstrap, no automatic probe
ENV_STACKS = "TRAINGUARD_STACKS"  # the folder a spawned child writes its stack dumps into
# in that folder: the watchdog touches it on a stall, each rank's probe then writes what PyTorch's flight
# recorder knows of its collectives (meta `flightrec.<rank>`, probe/flightrec.py)
COLLECTIVES_REQUEST = "collectives.request"
DEFAULT_GROUP = "default"  # how the probe's counters and recorder answers name the world process group
FLIGHT_ANSWER_PREFIX = "flightrec."  # + the rank: the meta key of its answer (with the step it works on)
# the probe's last drain waits for its device copies in this function of probe/drain.py: a main thread
# stuck there waits for its GPU (the watchdog reads it as a device wait, watchdog/classify.py)
PROBE_DEVICE_WAIT = ("trainguard/probe/drain.py", "_wait_for_device_copies")
ENV_CONTRACTS = "TRAINGUARD_CONTRACTS"  # "0": no API-contract checks (their hooks are not even installed)
ENV_CAPTURE_GATE = "TRAINGUARD_CAPTURE_GATE"  # "0": the probe leaves torch.cuda.CUDAGraph's capture alone
ENV_SINKS = "TRAINGUARD_SINKS"  # sinks to feed, comma-separated NAME[=VALUE]
ENV_NOTIFY = "TRAINGUARD_NOTIFY"  # where to tell a person: comma- or space-separated URLs (notify/targets.py)
ENV_NOTIFY_END = "TRAINGUARD_NOTIFY_END"  # "1": also the end message of a run that completed healthy
ENV_PY_SPY = "TRAINGUARD_PY_SPY"  # "0": never run py-spy (no ptrace of the run's processes at all)
ENV_OUTPUT_RULES = "TRAINGUARD_OUTPUT_RULES"  # "0": the printed-output rules are off
# The watchdog writes this file into the run folder when the job scheduler warned of or began to end the job
# (a time limit, a preemption): `guard.stop_requested` turns true, so the script can save and stop.
STOP_REQUESTED_FILE = "stop-requested"
ENV_DEBUG = "TRAINGUARD_DEBUG"  # set: an internal error shows its traceback
ENV_VERIFY = "TRAINGUARD_VERIFY"  # "0": checkpoints are not verified (checkpoints/verifier.py)
ENV_DEVICES = "TRAINGUARD_DEVICES"  # "0": no device telemetry (NVML, the kernel log: devices/sampler.py)
# a file, FIFO or device to follow as the kernel log instead of /dev/kmsg and its fallbacks (a node's forwarded
# log; a test's planted source), followed even without a GPU; "0": the kernel log is not followed (devices/kmsg.py)
ENV_KERNEL_LOG = "TRAINGUARD_KERNEL_LOG"

# -- environment: who a process is in a distributed job, as its launcher says (read, never set) --------
# torchrun's names first, Slurm's as the fallback (srun starting one process per rank itself); store/ranks.py

LAUNCHER_RANK = ("RANK", "SLURM_PROCID")  # global rank, unique in the job
LAUNCHER_LOCAL_RANK = ("LOCAL_RANK", "SLURM_LOCALID")  # rank on its node
LAUNCHER_NODE = ("GROUP_RANK", "SLURM_NODEID")  # the node's rank (torchrun's --node_rank)
LAUNCHER_WORLD_SIZE = ("WORLD_SIZE", "SLURM_NTASKS")
LAUNCHER_LOCAL_WORLD_SIZE = ("LOCAL_WORLD_SIZE",)

# -- event kinds: the `kind` of a row in the store's events table (and of what the rules read) ---------

EVENT_STEP = "step"  # a step row on its way to the rules (the store keeps steps in their own table)
EVENT_PROBE = "probe"  # the probe's life: start, set_step, finish, exit, auto-retired
EVENT_RUN = "run"  # the watchdog's: start, restart, end
EVENT_CRASH = "crash"  # an uncaught exception, named by its type, with frames and phase
EVENT_FINDING = "finding"  # a finding (Finding.to_dict()), named by the finding's name
EVENT_PHASE = "phase"  # a phase edge (begin/end), named by the phase
EVENT_EVAL = "eval"  # evaluation metrics
EVENT_CHECKPOINT = "checkpoint"  # a checkpoint written, named by its path
EVENT_SAMPLE = "sample"  # a memory sample ("memory")
EVENT_EXPERTS = "experts"  # an MoE layer's expert load
EVENT_CONTRACT = "contract"  # an API-contract observation (probe/contracts.py), named by its check
EVENT_PREFLIGHT = "preflight"  # what the fast-forward did (preflight only)
EVENT_OUTPUT = "output"  # printed-output counts (the watchdog's live rules only; never stored)
EVENT_PARAMS_NOT_IN_OPTIMIZER = "params-not-in-optimizer"  # trainable parameters no optimizer steps
# a checkpoint verified (checkpoints/verifier.py), named by its path: data holds the verdict ("status":
# verified | poisoned | unloadable | step-mismatch | unchanged | unverified), the facts and the costs
EVENT_CHECKPOINT_CHECK = "checkpoint-check"
# what a GPU or the kernel said (devices/): an Xid, ECC or row-remap counts that moved, a throttle that began,
# a kernel-log line (OOM killer, hung task). Named by what it is ("xid", "ecc", "remap", "throttle",
# "kernel"); data: gpu (index, pci bus id), the numbers, "serious" (a fault that needs the node drained)
EVENT_DEVICE = "device"
EVENT_DEVICE_SAMPLE = "device-sample"  # a GPU's clocks, temperature, power, memory every few seconds

EVENT_KINDS = (
    EVENT_STEP, EVENT_PROBE, EVENT_RUN, EVENT_CRASH, EVENT_FINDING, EVENT_PHASE, EVENT_EVAL, EVENT_CHECKPOINT,
    EVENT_SAMPLE, EVENT_EXPERTS, EVENT_CONTRACT, EVENT_PREFLIGHT, EVENT_OUTPUT, EVENT_PARAMS_NOT_IN_OPTIMIZER,
    EVENT_CHECKPOINT_CHECK, EVENT_DEVICE, EVENT_DEVICE_SAMPLE,
)
# Bookkeeping for the rules, kept in the store but never told as part of the run's story (the report's
# timeline): what a rule observes (a parameter checksum every few steps, a contract check, parameters no
# optimizer steps) becomes a finding when it means something; samples and counts are plotted or counted.
INTERNAL_EVENT_KINDS = frozenset({
    EVENT_STEP, EVENT_SAMPLE, EVENT_EXPERTS, EVENT_CONTRACT, EVENT_OUTPUT, EVENT_PARAMS_NOT_IN_OPTIMIZER,
    EVENT_DEVICE_SAMPLE,
})

# -- the heartbeat: one row per writing process, upserted at the flush after it changes ------------

HEARTBEAT_FIELDS = ("pid", "rank", "attempt", "t_progress", "t_flush", "micro", "step", "phase", "state")
BEAT_RUNNING = "running"
BEAT_FINISHED = "finished"  # the probe reached guard.finish()

# -- status.json ---------------------------------------------------------------------------------------

STATUS_NAME = "status.json"
# `state` says how the process is or ended; `abandoned` is only ever read, never written (a live state
# whose owner is gone, see store/owner.py). `cut-off`: its job scheduler ended it (a time limit, a preemption,
# a requeue, a node's failure); `diagnose` names a log's ending with the same word.
STATES = ("running", "hung", "completed", "failed", "crashed", "killed", "cut-off")
LIVE_STATES = ("running", "hung")
# A preflight's verdict is a field beside the state (the script's start ended; the check passed or not).
PREFLIGHT_OUTCOMES = ("passed", "incomplete", "failed")
WATCHERS = ("probe", "watchdog", "preflight", "keeper")  # who wrote it: `watched_by`


def checked_status(status: dict[str, Any]) -> Status:
    """`status` if it keeps the contract: a known `state` (and preflight outcome); a ValueError otherwise.

    Every writer of status.json goes through this, so no new state can slip in beside the documented ones.
    """
    state = status.get("state")
    if state not in STATES:
        raise ValueError(f"status.json: unknown state {state!r} (one of {', '.join(STATES)})")
    outcome = status.get("preflight_outcome")
    if outcome is not None and outcome not in PREFLIGHT_OUTCOMES:
        raise ValueError(f"status.json: unknown preflight outcome {outcome!r} (one of {', '.join(PREFLIGHT_OUTCOMES)})")
    return status  # type: ignore[return-value]  # checked above; the rest is the writer's own typing


if TYPE_CHECKING:
    from typing import Any, Literal, TypedDict

    State = Literal["running", "hung", "completed", "failed", "crashed", "killed", "cut-off"]
    PreflightOutcome = Literal["passed", "incomplete", "failed"]
    Watcher = Literal["probe", "watchdog", "preflight", "keeper"]

    class _StatusRequired(TypedDict):
        state: State

    class Status(_StatusRequired, total=False):
        """status.json (store/status.py writes it, `read_status` shapes what it reads back)."""

        health: Literal["ok", "warning", "error"]  # derived by the writer from state and findings
        step: int | None  # the last optimizer step known
        total_steps: int | None  # the plan's
        phase: str | None  # the phase in progress
        exit_code: int | None  # the command's (a preflight: the exit code preflight itself gives)
        signal: str | None  # the signal that ended it ("SIGKILL")
        loss: float | None
        lr: float | None
        pid: int | None  # the watched command's process
        command: list[str]
        started: float
        updated: float
        ended: float | None  # set once the state is final
        attempt: int
        stall_timeout: float
        output_lines: int
        output_dropped_bytes: int
        watched_by: Watcher
        owner: dict[str, Any]  # the writing process (pid, start time): readers tell a dead owner
        command_started: Any
        findings: list[dict[str, Any]]  # Finding.to_dict() each, most severe first
        scheduler: dict[str, Any]  # the job scheduler's view (Slurm: job, time limit, end, restarts, ended_by)
        state_note: str  # a sentence on an unusual ending (the watchdog failed, was killed...)
        reason: str
        preflight: dict[str, Any]  # a preflight's summary (what was fast-forwarded, resumed, written)
        preflight_outcome: PreflightOutcome
        recorded_state: str  # (read back) the state written before the owner was found gone

    class StepRow(TypedDict, total=False):
        """One optimizer step of one rank: what the probe writes to the steps table and the rules read.

        Any field may be missing or None (a log reader knows less than the probe).
        """

        kind: Literal["step"]
        step: int
        t: float
        micro: int | None  # micro-batches seen when the step closed
        loss: float | None  # mean over the step's micro-batches
        lr: float | None  # the first param group's
        grad_norm: float | None
        update_ratio: float | None  # |update| / |weights| on a sample of the parameters
        nonfinite: int | None  # 1 when the gradient norm is not finite
        step_time: float | None  # seconds since the previous step closed
        data_wait: float | None  # seconds waiting for batches during this step
        loss_scale: float | None  # AMP's
        sched_epoch: int | None  # the scheduler's own step count
        parts: dict[str, float]  # named loss components
        weights: dict[str, float]  # the weight each part carries
        extra: dict[str, Any]  # guard.log() values and rarer fields (lrs, params_without_grad, incomplete,
        #                        presync_s: a rank's seconds before it synchronises, probe/syncwait.py...)
        rank: int
        attempt: int
        rowid: int  # (read back) the row's position in the store

    class Event(TypedDict, total=False):
        """Anything that is not a step: `kind` is one of EVENT_KINDS, `data` is JSON."""

        kind: str
        name: str | None
        step: int | None
        t: float | None
        data: Any
        id: int  # (read back) the event's position in the store
        attempt: int
        rank: int
        pid: int | None

    class Heartbeat(TypedDict):
        """One writing process's liveness, as the watchdog reads it (HEARTBEAT_FIELDS)."""

        pid: int
        rank: int
        attempt: int
        t_progress: float | None  # the last *training* progress (not the flush)
        t_flush: float
        micro: int | None
        step: int | None
        phase: str | None
        state: str | None  # BEAT_RUNNING or BEAT_FINISHED
