"""Who a writing process is in a distributed job: its rank, and the node and host it runs on.

torchrun (and the elastic agent behind it) tells each worker who it is through its environment:
`RANK` (global, unique in the job), `LOCAL_RANK` (on its node), `GROUP_RANK` (the node's rank, what
`--node_rank` set), `WORLD_SIZE` and `LOCAL_WORLD_SIZE`. Slurm's `srun` without torchrun gives
`SLURM_PROCID` / `SLURM_LOCALID` / `SLURM_NODEID` instead. A plain `python train.py` has none of them:
rank 0 of a world of 1 on node 0.

Each process writes one row of the `ranks` table (schema.py) when its probe starts: the store's steps,
events and heartbeats carry only the rank, and this table maps a rank (of an attempt) to its node and
host, so that a reader can say "rank 3 on node 1 (host gpu-b)" and group ranks by node.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from typing import TypedDict

from trainguard.contract import (
    LAUNCHER_LOCAL_RANK,
    LAUNCHER_LOCAL_WORLD_SIZE,
    LAUNCHER_NODE,
    LAUNCHER_RANK,
    LAUNCHER_WORLD_SIZE,
)


class RankInfo(TypedDict):
    """One process's place in the job: one row of the `ranks` table."""

    rank: int  # global rank (RANK); 0 outside a distributed job
    local_rank: int  # rank on its node (LOCAL_RANK)
    node: int  # the node's rank (torchrun's GROUP_RANK, i.e. --node_rank); 0 on one node
    host: str  # the host name the process runs on
    world_size: int
    local_world_size: int
    pid: int


def _int_env(environ: Mapping[str, str], names: tuple[str, ...], default: int) -> int:
    for name in names:
        raw = (environ.get(name) or "").strip()
        if raw:
            try:
                return int(raw)
            except ValueError:
                continue  # a launcher's odd value is not worth failing a run over; the next name may do
    return default


def rank_info(environ: Mapping[str, str] | None = None) -> RankInfo:
    """This process's rank, node and host, from the launcher's environment (os.environ by default)."""
    env = os.environ if environ is None else environ
    world = max(1, _int_env(env, LAUNCHER_WORLD_SIZE, 1))
    return RankInfo(
        rank=_int_env(env, LAUNCHER_RANK, 0),
        local_rank=_int_env(env, LAUNCHER_LOCAL_RANK, 0),
        node=_int_env(env, LAUNCHER_NODE, 0),
        host=socket.gethostname(),
        world_size=world,
        local_world_size=max(1, _int_env(env, LAUNCHER_LOCAL_WORLD_SIZE, world)),
        pid=os.getpid(),
    )


def launched_alone(environ: Mapping[str, str] | None = None) -> bool:
    """True when this process is the job's only writer: a world of one where a launcher says so
    (WORLD_SIZE, SLURM_NTASKS), else no RANK at all (a hand-made launch that sets RANK without WORLD_SIZE
    has several writers; SLURM_PROCID alone does not count: a one-task batch script has it too)."""
    env = os.environ if environ is None else environ
    if any((env.get(name) or "").strip() for name in LAUNCHER_WORLD_SIZE):
        return _int_env(env, LAUNCHER_WORLD_SIZE, 1) <= 1
    return not (env.get("RANK") or "").strip()


def describe(rank: int, info: Mapping[int, RankInfo] | None = None) -> str:
    """'rank 3' on one node; 'rank 3 (node 1)' when the ranks span nodes; 'rank 3 (node 1, gpu-b)' when
    they span hosts too (two simulated nodes on one machine share a host)."""
    if not info or rank not in info:
        return f"rank {rank}"
    r = info[rank]
    if len({x["node"] for x in info.values()}) < 2:
        return f"rank {rank}"
    if len({x["host"] for x in info.values()}) < 2:
        return f"rank {rank} (node {r['node']})"
    return f"rank {rank} (node {r['node']}, {r['host']})"
