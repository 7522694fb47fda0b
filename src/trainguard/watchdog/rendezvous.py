"""A distributed job's start-up waiting in its rendezvous for ranks or nodes that were never started.

    monitor = RendezvousWatch(run_dir)      # the supervisor polls it with its other monitors

Two waits look the same from outside (no output, no step, a process asleep) and are told apart here:

- a rank in `torch.distributed.init_process_group`: its c10d store (`torch/distributed/rendezvous.py`,
  `_create_c10d_store`) is a TCPStore that rank 0 hosts and waits on until `world_size` ranks connected
  ("Timed out after N seconds waiting for clients. 1/2 clients joined" comes only at the timeout, 30 min
  by default); a non-zero rank waits there for rank 0's store to come up;
- torchrun's agent, before any rank runs: the static rendezvous (`--nnodes=2 --node-rank=0`, the default
  backend) hosts a TCPStore that waits for the other nodes' agents; the c10d (dynamic) rendezvous waits for
  `--nnodes`' minimum (`torch/distributed/elastic/rendezvous/`), 600 s by default.

While the run has not recorded a training step, the Python processes of its tree are asked for their
stacks through the probe's signal handler (probe/stackdump.py, installed at interpreter start-up under
`trainguard run`; a dump costs the process a few milliseconds), at 3 s and then at intervals growing to a
minute. A main thread found inside the rendezvous at two looks `WAIT_BEFORE_SAYING` seconds apart is a
start-up waiting for peers: the finding names the rendezvous, who waits, how many ranks or nodes have not
joined (from the environment, torchrun's command line, or the waiting frame's arguments read once with
py-spy), since when, and the fix. It is said once, and the run is not stopped for it: a node started late
by hand joins and the job goes on.

Never connects to the store itself: a client that connects to a static rendezvous's TCPStore counts as a
joined worker.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainguard.findings import WATCHDOG, Code, Finding

FIRST_LOOK = 3.0  # seconds after the run started before the first look
LOOK_GROWTH = 1.5  # each look waits this much longer than the last ...
LOOK_MAX = 60.0  # ... up to a minute
LOOK_LIMIT = 1800.0  # no looks after this long without a step (the stall machinery has taken over)
WAIT_BEFORE_SAYING = 10.0  # seconds one process is seen waiting in the rendezvous before it is said
MAX_ASKED = 16  # processes asked for their stack at one look (each dump waits up to a second: the poll is bounded)

_TORCHRUN = ("torchrun", "torch.distributed.run", "torch.distributed.launch")
_RANK_FILES = ("torch/distributed/rendezvous.py",)
_RANK_FUNCS = {("torch/distributed/distributed_c10d.py", "_store_based_barrier"),
               ("torch/distributed/distributed_c10d.py", "_new_process_group_helper")}
_AGENT_DIR = "torch/distributed/elastic/rendezvous/"


@dataclass
class Waiter:
    """One process of the run found waiting in a rendezvous."""

    pid: int
    kind: str  # "rank" (init_process_group) | "agent" (torchrun's rendezvous before its ranks start)
    frame: str  # the innermost frame inside the rendezvous, "file:line in function"
    cmdline: list[str]
    env: dict[str, str]
    args: dict[str, str] = field(default_factory=dict)  # the waiting frames' arguments (py-spy), where read


class RendezvousWatch:
    """A Supervisor monitor: says a rendezvous that waits for ranks or nodes that never came."""

    def __init__(self, run_dir: Path) -> None:
        self.stacks_dir = Path(run_dir) / "stacks"
        self.first_seen: dict[int, float] = {}
        self.next_look: float | None = None
        self.interval = FIRST_LOOK
        self.done = False

    def poll(self, state: Any) -> list[Finding]:
        if self.done:
            return []
        now = state.now
        if state.step or now - state.started > LOOK_LIMIT:
            self.done = True  # the job trains (its rendezvous is behind it), or this is no start-up any more
            return []
        if self.next_look is None:
            self.next_look = state.started + FIRST_LOOK
        if now < self.next_look:
            return []
        self.interval = min(LOOK_MAX, self.interval * LOOK_GROWTH)
        waiting = waiters(state.pid, self.stacks_dir)
        self.first_seen = {w.pid: self.first_seen.get(w.pid, now) for w in waiting}
        # the next look comes when the first waiter has waited long enough to be said, or later
        due = [self.first_seen[w.pid] + WAIT_BEFORE_SAYING for w in waiting]
        self.next_look = now + min([self.interval] + [max(0.5, d - now) for d in due])
        long = [w for w in waiting if now - self.first_seen[w.pid] >= WAIT_BEFORE_SAYING]
        if not long:
            return []
        self.done = True
        for w in long:
            if not _world_known(w):
                w.args = _frame_args(w.pid)
        return [rendezvous_finding(long, waiting_since=min(self.first_seen[w.pid] for w in long), now=now,
                                   step=state.step)]


def waiters(root_pid: int, stacks_dir: Path) -> list[Waiter]:
    """The processes of the tree under `root_pid` whose main thread waits inside a rendezvous now."""
    import psutil

    from trainguard.watchdog import stacks

    out = []
    try:
        root = psutil.Process(root_pid)
        procs = [root] + root.children(recursive=True)
    except psutil.Error:
        return []
    asked = 0
    for p in procs:
        if asked >= MAX_ASKED:
            break
        info = stacks._handler_info(stacks_dir, p.pid)
        if info is None or not stacks.catches_signal(p.pid, int(info["signal"])):
            continue  # no handler of ours (not Python, or started without the bootstrap): not asked
        asked += 1
        threads = stacks.signal_dump(p.pid, Path(info["file"]), int(info["signal"]), info.get("main_thread"))
        main = [t for t in threads if t.main] or threads[:1]
        for t in main:
            kind, frame = _in_rendezvous(t.frames)
            if kind is None:
                continue
            try:
                cmdline, env = p.cmdline(), p.environ()
            except psutil.Error:
                cmdline, env = [], {}
            out.append(Waiter(pid=p.pid, kind=kind, frame=frame, cmdline=cmdline, env=env))
            break
    return out


def _in_rendezvous(frames: list[Any]) -> tuple[str | None, str]:
    """("rank" | "agent", the innermost rendezvous frame) when a stack (outermost first) waits in one."""
    for f in reversed(frames):
        path = f.file.replace(os.sep, "/")
        if _AGENT_DIR in path:
            return "agent", f.text()
        if path.endswith(_RANK_FILES) or any(path.endswith(file) and f.function == fn for file, fn in _RANK_FUNCS):
            return "rank", f.text()
    return None, ""


def _world_known(w: Waiter) -> bool:
    return w.kind == "agent" or _int(w.env.get("WORLD_SIZE")) is not None


def _frame_args(pid: int) -> dict[str, str]:
    """The arguments of the frames inside the rendezvous (world_size, rank, hostname, port), read once with
    py-spy (ptrace rights needed; {} without): a world size passed in code is in no environment."""
    from trainguard.watchdog import stacks

    spy = stacks.find_py_spy()
    if not spy:
        return {}
    threads, _ = stacks.py_spy_dump(pid, spy)
    found: dict[str, str] = {}
    for t in threads:
        for f in t.frames:  # outermost first: the innermost frame's values win
            for key in ("world_size", "rank", "hostname", "port", "init_method"):
                if f.locals and key in f.locals:
                    found[key] = f.locals[key]
    return found


def _torchrun_opts(cmdline: list[str]) -> dict[str, str]:
    at = next((i for i, c in enumerate(cmdline) if any(c == t or Path(c).name == t for t in _TORCHRUN)), None)
    opts: dict[str, str] = {}
    if at is None:
        return opts
    args, i = cmdline[at + 1:], 0
    while i < len(args) and args[i].startswith("--"):
        name, eq, value = args[i][2:].partition("=")
        if not eq and i + 1 < len(args) and not args[i + 1].startswith("--"):
            value, i = args[i + 1], i + 1
        opts[name.replace("-", "_")] = value
        i += 1
    return opts


def _int(value: Any) -> int | None:
    try:
        return int(str(value).strip().strip("'\""))
    except (TypeError, ValueError):
        return None


def _rank_account(ranks: list[Waiter]) -> dict[str, Any]:
    """How many ranks a rank-level rendezvous waits for, from the waiters' environment or frames."""
    first = ranks[0]
    world = _int(first.env.get("WORLD_SIZE")) or _int(first.args.get("world_size"))
    here = sorted({r for r in (_int(w.env.get("RANK", w.args.get("rank"))) for w in ranks) if r is not None})
    host = first.env.get("MASTER_ADDR") or first.args.get("hostname", "").strip("'\"") or None
    port = first.env.get("MASTER_PORT") or first.args.get("port")
    store = f"{host}:{port}" if host and port else None
    missing = world - len(ranks) if world else None
    return {"world_size": world, "ranks_waiting": here, "processes_waiting": len(ranks), "store": store,
            "missing": missing if missing is None or missing > 0 else None}


def _agent_account(agent: Waiter) -> dict[str, Any]:
    # torchrun's options from its command line, else from the PET_* environment its argparse also reads
    opts = {**{k[4:].lower(): v for k, v in agent.env.items() if k.startswith("PET_")}, **_torchrun_opts(agent.cmdline)}
    nnodes = opts.get("nnodes", "1")
    lo, _, hi = nnodes.partition(":")
    need, most = _int(lo), _int(hi or lo)
    backend = opts.get("rdzv_backend", "static")
    endpoint = opts.get("rdzv_endpoint") or (f"{opts.get('master_addr', '127.0.0.1')}:{opts.get('master_port', 29500)}"
                                             if backend == "static" else None)
    node = _int(opts.get("node_rank", agent.env.get("GROUP_RANK", "0")))
    return {"nnodes": nnodes, "min_nodes": need, "max_nodes": most, "node_rank": node, "backend": backend,
            "store": endpoint, "nproc_per_node": opts.get("nproc_per_node")}


def rendezvous_finding(waiting: list[Waiter], *, waiting_since: float, now: float, step: int | None) -> Finding:
    """TG712 rendezvous-incomplete: the job's start-up waits in its rendezvous for ranks or nodes that never came.

    ## What it detects
    While the run has recorded no training step, a process of it whose main thread has waited at least
    10 s inside a rendezvous: `init_process_group`'s c10d store (rank 0 hosts a TCPStore and waits until
    `world_size` ranks connected; another rank waits for rank 0's store) or torchrun's agent in its static
    or c10d rendezvous (waiting for the other nodes of `--nnodes`). Found on the processes' stacks, taken
    through the probe's signal handler at 3 s and at growing intervals after.

    ## Why it matters
    PyTorch says nothing while it waits: `init_process_group` fails only at its timeout (30 min by
    default) with "Timed out after 1801 seconds waiting for clients. 1/2 clients joined", torchrun's
    rendezvous after 600 s. Until then the job looks like a slow start, and a generic stall report comes
    only after minutes.

    ## Example
    `TG712 rendezvous-incomplete [warning]: the rendezvous at 127.0.0.1:29500 waits for 1 more rank of 2
    (world size 2; rank 0 started, waiting in _create_c10d_store) since 12 s`

    ## What to change
    Start every rank or node the job declares, with the same rendezvous (MASTER_ADDR/MASTER_PORT, or
    `--rdzv-endpoint` and `--rdzv-id`), or declare the number you start: `WORLD_SIZE` / `world_size=` the
    number of processes (`mp.spawn(nprocs=...)`, `--nproc-per-node`), `--nnodes` the number of nodes (or
    `--nnodes=MIN:MAX` for an elastic job).

    ## Known false positives
    Nodes started by hand more than 10 s apart: the finding says the wait, and the job goes on once they
    join (the run is not stopped for it).
    """
    ranks = [w for w in waiting if w.kind == "rank"]
    agents = [w for w in waiting if w.kind == "agent"]
    seconds = now - waiting_since
    since = time.strftime("%H:%M:%S", time.localtime(waiting_since))
    if agents:
        acc = _agent_account(agents[0])
        need, node = acc["min_nodes"], acc["node_rank"]
        store = acc["store"] or "its rendezvous endpoint"
        if need and need >= 2:
            more = "1 more node" if need == 2 else f"up to {need - 1} more nodes"
            what = f"waits for {more} of {need} (--nnodes={acc['nnodes']}; node {node} here)"
        else:
            what = f"waits for the other nodes (--nnodes={acc['nnodes']}; node {node} here)"
        summary = (f"torchrun's {acc['backend']} rendezvous at {store} {what}, since {since} ({seconds:.0f} s); "
                   "no rank has started")
        fix = ("start torchrun on the other node(s) with the same --nnodes, --master-addr/--master-port (or "
               "--rdzv-endpoint and --rdzv-id) and their own --node-rank, or run with --nnodes equal to the "
               "nodes you start (--nnodes=1 --nproc-per-node=N on one machine, or --nnodes=MIN:MAX)")
        evidence: dict[str, Any] = {**acc, "waiting_pid": agents[0].pid, "frame": agents[0].frame}
        where = agents[0].frame
    else:
        acc = _rank_account(ranks)
        store = acc["store"] or "its store"
        started = ", ".join(str(r) for r in acc["ranks_waiting"]) or f"{acc['processes_waiting']} process(es)"
        if acc["missing"]:
            what = (f"waits for {acc['missing']} more rank{'s' if acc['missing'] > 1 else ''} of "
                    f"{acc['world_size']} (world size {acc['world_size']}; rank {started} started)")
        else:
            what = f"waits for ranks that have not connected (rank {started} started; world size " \
                   f"{acc['world_size'] or 'unknown'})"
        summary = f"init_process_group's rendezvous at {store} {what}, since {since} ({seconds:.0f} s)"
        fix = ("start every rank of the world size with the same MASTER_ADDR/MASTER_PORT (RANK 0 .. WORLD_SIZE-1), "
               "or pass the number of processes you start as world_size (mp.spawn(nprocs=world_size), "
               "torchrun --nproc-per-node sets WORLD_SIZE itself)")
        evidence = {**acc, "waiting_pids": [w.pid for w in ranks], "frame": ranks[0].frame}
        where = ranks[0].frame
    evidence.update({"waiting_since": round(waiting_since, 3), "seconds_waiting": round(seconds, 1)})
    return Finding.of(RENDEZVOUS_INCOMPLETE, step=step, summary=summary, evidence=evidence, fix=fix,
                      cause=RENDEZVOUS_INCOMPLETE.name, where=where, source="watchdog")


RENDEZVOUS_INCOMPLETE = Code("TG712", "rendezvous-incomplete", "warning", needs=(WATCHDOG,),
                             page=rendezvous_finding, status="preview")


def crash_after_rendezvous(crashed: Finding, earlier: list[Finding]) -> Finding:
    """A crash that came while the start-up waited in its rendezvous (TG712 said before it, no step since):
    its summary says so and its fix is the rendezvous's (the crash, typically the store's "Timed out ...
    waiting for clients", is the wait's end). Any other crash is returned unchanged."""
    waits = [f for f in earlier if f.code == RENDEZVOUS_INCOMPLETE.code]
    if not waits or crashed.evidence.get("after_rendezvous") or crashed.step:
        return crashed
    wait = waits[0]
    crashed.summary += f"; it came while the start-up waited in its rendezvous ({wait.code}: {wait.summary})"
    crashed.fix = f"The ranks or nodes the rendezvous waited for never came: {wait.fix}. " + crashed.fix
    crashed.evidence["after_rendezvous"] = {"code": wait.code, "store": wait.evidence.get("store"),
                                            "missing": wait.evidence.get("missing")}
    return crashed
