"""Many nodes: one `trainguard run` per node, each telling the others it lives through torch.distributed's store.

    launch = parse_launch(["torchrun", "--nnodes=2", "--node_rank=1", "--rdzv-backend=c10d",
                           "--rdzv-endpoint=10.0.0.1:29400", "train.py"])      # NodeLaunch(node=1, nnodes=2, ...)
    watch = NodeWatch(launch, run_dir)      # a Supervisor monitor: poll(state) -> [node-lost findings]

Slurm's `srun` or a Kubernetes pod starts one `trainguard run -- torchrun ...` per node. Each watchdog
writes its node's part of the run in `RUN/node-<N>/` (store/nodes.py reads them back as one run) and, every
`BEAT` seconds, puts a small record under `trainguard/<rdzv id>/node/<N>` in the job's rendezvous store:
the c10d `TCPStore` torchrun's agents already share at `--rdzv-endpoint`. No network layer of our own:
the same store the ranks met through carries the watchdogs' beats.

A node whose beat stops changing for `LOST_AFTER` seconds, without having said that its part ended, is
lost (its agent and watchdog killed, its machine gone): TG711 `node-lost` on every surviving node, with
the node's last step and when it was last heard from. What the ranks of this node do next (a "Connection
closed by peer", a wait in an all-reduce) is a consequence of it.

Known limit: the store lives in the agent that hosts the rendezvous (the node whose address is the
endpoint). When that node is the one lost, the store goes with it and the others cannot read beats any
more; they then see their ranks fail or hang, which the crash and hang findings report.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainguard.findings import Finding
from trainguard.rules.scheduler import NODE_LOST, node_lost

BEAT = 2.0  # seconds between a watchdog's beats in the store
LOST_AFTER = 20.0  # seconds without a new beat from a node that had beaten: it is lost
CONNECT_TIMEOUT = 5.0  # seconds one attempt to reach the store may take (the background thread retries)
_TORCHRUN = ("torchrun", "torch.distributed.run", "torch.distributed.launch")


@dataclass(frozen=True)
class NodeLaunch:
    """What a node's torchrun command line says about the job's nodes."""

    node: int  # --node_rank
    nnodes: int  # --nnodes (the maximum of MIN:MAX)
    host: str  # the rendezvous endpoint's host
    port: int  # ... and port
    rdzv_id: str  # --rdzv-id: one job among others on the same store


def parse_launch(command: list[str]) -> NodeLaunch | None:
    """A NodeLaunch for a torchrun command over more than one node with a c10d rendezvous, else None."""
    at = next((i for i, c in enumerate(command) if any(Path(c).name == t or c == t for t in _TORCHRUN)), None)
    if at is None:
        return None
    opts: dict[str, str] = {}
    args = command[at + 1:]
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--"):
            break  # the training script: what follows is its own
        name, eq, value = arg[2:].partition("=")
        name = name.replace("-", "_")
        if not eq and i + 1 < len(args) and not args[i + 1].startswith("--"):
            value, i = args[i + 1], i + 1
        opts[name] = value
        i += 1
    try:
        nnodes = int(opts.get("nnodes", "1").split(":")[-1])
        node = int(opts.get("node_rank", os.environ.get("GROUP_RANK", "0")) or 0)
    except ValueError:
        return None
    endpoint = opts.get("rdzv_endpoint", "")
    if nnodes < 2 or opts.get("rdzv_backend", "c10d") != "c10d" or not endpoint:
        return None
    host, _, port = endpoint.rpartition(":")
    if not host or not port.isdigit():
        return None
    return NodeLaunch(node=node, nnodes=nnodes, host=host.strip("[]"), port=int(port),
                      rdzv_id=opts.get("rdzv_id", "none"))


class NodeWatch:
    """A Supervisor monitor: beats for this node in the rendezvous store, and finds nodes that went silent.

    The store is touched only from its own thread (connecting may wait for the rendezvous host to come up);
    `poll` reads what that thread saw and returns at once, as monitors must."""

    def __init__(self, launch: NodeLaunch, run_dir: Path) -> None:
        self.launch = launch
        self.run_dir = str(run_dir)
        self.prefix = f"trainguard/{launch.rdzv_id}/node/"
        self._step: int | None = None
        self._ended = False
        self._seen: dict[int, dict[str, Any]] = {}  # node -> its last beat, with "changed": our clock
        self._reported: set[int] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.error: str | None = None
        self._thread = threading.Thread(target=self._loop, name="trainguard-nodes", daemon=True)
        self._thread.start()

    # -- the monitor's surface ----------------------------------------------------------------------

    def poll(self, state: Any) -> list[Finding]:
        self._step = state.step
        now = time.time()
        out = []
        with self._lock:
            for node, beat in self._seen.items():
                if node in self._reported or beat.get("ended") or now - beat["changed"] < LOST_AFTER:
                    continue
                self._reported.add(node)
                out.append(node_lost_finding(node, beat, silent=now - beat["changed"], this_node=self.launch.node,
                                             step=state.step, endpoint=f"{self.launch.host}:{self.launch.port}"))
        return out

    def finish(self, state: Any) -> list[Finding]:
        """This node's part ended: say so in the store, so the others do not take it for lost."""
        self._ended = True
        self._step = state.step
        self._stop.set()
        self._thread.join(timeout=CONNECT_TIMEOUT + 1)
        self._beat_once(self._store)
        self._store = None  # closed here, not at interpreter exit (a live TCPStore then aborts the process)
        return []

    # -- the store's thread ---------------------------------------------------------------------------

    _store: Any = None

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                if self._store is None:
                    self._store = self._connect()
                self._beat_once(self._store)
                self._read_others(self._store)
                self.error = None
            except Exception as exc:
                # Why not give up: the rendezvous host may not be up yet, or be restarting; a store that does
                # not answer never makes a finding by itself (see the known limit above).
                self.error = f"{type(exc).__name__}: {exc}"
                self._store = None
            self._stop.wait(BEAT)

    def _connect(self) -> Any:
        import datetime
        import sys

        if "torch" not in sys.modules:
            # This process's own C++ warnings off, before torch reads the level: the rendezvous host ends
            # with its job, often before this node's last beat, and c10d then printed a 20-frame
            # "sendBytes failed ... Broken pipe" trace into the user's terminal at the end of a healthy
            # run. The error still raises and is kept in `self.error`; the command's processes, started
            # before this, never see the variable, which is taken away again at once.
            ours = "TORCH_CPP_LOG_LEVEL" not in os.environ
            if ours:
                os.environ["TORCH_CPP_LOG_LEVEL"] = "ERROR"
            try:
                import torch.distributed  # noqa: F401
            finally:
                if ours:
                    os.environ.pop("TORCH_CPP_LOG_LEVEL", None)
        from torch.distributed import TCPStore

        # a plain connect first: until the rendezvous host is up, TCPStore would print a C++ trace per try
        with socket.create_connection((self.launch.host, self.launch.port), timeout=CONNECT_TIMEOUT):
            pass
        return TCPStore(self.launch.host, self.launch.port, is_master=False, wait_for_workers=False,
                        timeout=datetime.timedelta(seconds=CONNECT_TIMEOUT))

    def _beat_once(self, store: Any) -> None:
        if store is None:
            return
        try:
            store.set(self.prefix + str(self.launch.node), json.dumps({
                "t": time.time(), "step": self._step, "host": socket.gethostname(), "pid": os.getpid(),
                "run_dir": self.run_dir, "ended": self._ended,
                # under Slurm, the node's name as the scheduler knows it (what `scontrol show node` takes)
                "slurm_node": os.environ.get("SLURMD_NODENAME") or None}))
        except Exception as exc:
            self.error = f"{type(exc).__name__}: {exc}"

    def _read_others(self, store: Any) -> None:
        now = time.time()
        for node in range(self.launch.nnodes):
            if node == self.launch.node:
                continue
            key = self.prefix + str(node)
            if not store.check([key]):
                continue
            raw = store.get(key)
            beat = json.loads(raw.decode() if isinstance(raw, bytes) else raw)
            with self._lock:
                before = self._seen.get(node)
                # measured on this node's clock (the nodes' clocks may disagree): when the beat last changed
                changed = now if before is None or before.get("t") != beat.get("t") else before["changed"]
                self._seen[node] = {**beat, "changed": changed}
                asked = (before or {}).get("slurm_asked", False)
            if beat.get("slurm_node") and not beat.get("ended") and not asked and now - changed >= LOST_AFTER / 2:
                # a node going silent under Slurm: ask Slurm why, here in this thread (bounded, fail-open), so
                # that poll() has Slurm's state and reason when it says the node is lost
                from trainguard.watchdog.slurm import node_state

                state = node_state(beat["slurm_node"], timeout=CONNECT_TIMEOUT)
                with self._lock:
                    self._seen[node]["slurm_asked"] = True
                    if state is not None:
                        self._seen[node].update(slurm_state=state.state, slurm_reason=state.reason)


def node_lost_finding(node: int, beat: dict[str, Any], *, silent: float, this_node: int, step: int | None,
                      endpoint: str) -> Finding:
    """TG711 node-lost (its page: rules/scheduler.py) for a node whose beat stopped."""
    host = beat.get("host")
    name = beat.get("slurm_node")
    said = ""
    if name and beat.get("slurm_state"):
        reason = beat.get("slurm_reason")
        said = f"; Slurm says {name}: {beat['slurm_state']}" + (f", reason \"{reason}\"" if reason else "")
    who = ", ".join(x for x in (f"Slurm node {name}" if name else "", f"host {host}" if host else "") if x)
    return node_lost(
        step=step,
        summary=(f"node {node}{f' ({who})' if who else ''} lost: no beat for {silent:.0f} s through the "
                 f"rendezvous store at {endpoint}; last at step {beat.get('step')}{said}. What this node's ranks do "
                 "next (a closed connection, a wait in a collective) is a consequence"),
        evidence={"lost_node": node, "host": host, "slurm_node": name, "slurm_state": beat.get("slurm_state"),
                  "slurm_reason": beat.get("slurm_reason"), "seconds_silent": round(silent, 1),
                  "last_step": beat.get("step"), "last_beat_at": beat.get("t"), "pid": beat.get("pid"),
                  "its_run_dir": beat.get("run_dir"), "seen_from_node": this_node, "store": endpoint},
        fix=("Find why that node went away (the scheduler's log: preemption, time limit, node failure; the kernel "
             "log: the OOM killer; its own part of the run folder). Restart from the last checkpoint; an elastic "
             "--nnodes=MIN:MAX with --max-restarts lets torchrun go on without it."),
        cause=NODE_LOST.name, where=f"node {name or node}", source="watchdog",
    )
