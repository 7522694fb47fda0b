"""The preflight's decisions, shared by every rank of a torchrun job through torch.distributed's own store.

    lock = Lockstep.for_process(rank, world_size)
    lock.decide(f"due/{name}/{step}", local_answer)    # rank 0 decides, every rank gets the same answer
    lock.stop_step(step, done)                         # the step at which every rank stops (or None)
    lock.all_stopped()                                 # every rank reached its stop (bounded wait)

Why: under torchrun every rank runs the fast-forward. A rank whose `guard.due("eval", 500)` answers True
while another's answers False makes the first enter the evaluation's collectives alone: the job
deadlocks. A rank that stops one step before the others leaves them waiting in the next step's
all-reduce. So rank 0 decides, writes its answer to the job's store (the default process group's store,
the TCPStore torchrun's rendezvous made), and the other ranks read it.

The stop is one step ahead: rank 0 finds the fast-forward done after step S and announces S + 1. A rank
of a data-parallel job is never more than one step ahead of rank 0 (the next step's all-reduce waits for
it), so every rank reads the announcement before it passes S + 1, and all stop after the same step.

Bounded and fail-open: a follower waits at most `WAIT` seconds for an answer rank 0 never gives (a
`guard.due` that only that rank calls), then decides alone and says so in guard.log. Without an
initialised process group (one process, or before init_process_group) every answer is the local one.
"""

from __future__ import annotations

import datetime
import time
from typing import Any

PREFIX = "trainguard/preflight/"
WAIT = 10.0  # seconds a follower waits for rank 0's answer before deciding alone
STOP_POLL = 1.0  # seconds a locally-done follower waits for rank 0's stop announcement, per step


class Lockstep:
    """Rank 0's preflight decisions, read by every other rank."""

    def __init__(self, rank: int, world_size: int, store: Any = None, log: Any = None) -> None:
        self.rank = rank
        self.world_size = world_size
        self._store = store
        self._log = log or (lambda msg: None)
        self.announced: int | None = None

    @classmethod
    def for_process(cls, rank: int, world_size: int, log: Any = None) -> Lockstep:
        return cls(rank, world_size, None, log)

    def store(self) -> Any:
        """The job's store once torch.distributed is initialised, else None (decisions stay local)."""
        if self._store is None and self.world_size > 1:
            try:
                import torch.distributed as dist

                if dist.is_available() and dist.is_initialized():
                    from torch.distributed import distributed_c10d as c10d

                    self._store = c10d._get_default_store()
            except Exception as exc:
                self._log(f"no torch.distributed store, each rank decides alone: {exc}")
                self.world_size = 1
        return self._store

    def decide(self, key: str, local: bool) -> bool:
        """Rank 0's answer for `key` (its own `local`); the others wait for it, bounded."""
        store = self.store()
        if store is None:
            return local
        try:
            if self.rank == 0:
                _set(store, PREFIX + key, "1" if local else "0")
                return local
            return self._get(store, key, WAIT) == "1"
        except Exception as exc:  # rank 0 never made this call: decide alone, and say so
            self._log(f"rank 0 gave no answer for {key!r} within {WAIT:g} s, rank {self.rank} decided alone "
                      f"({'yes' if local else 'no'}): {type(exc).__name__}")
            return local

    def stop_step(self, step: int, done: bool) -> int | None:
        """The optimizer step after which every rank stops, once known here: rank 0 announces `step + 1`
        when it is done at `step`; a follower reads it (waiting a moment once it is done itself)."""
        if self.announced is not None:
            return self.announced
        store = self.store()
        if store is None:
            return step if done else None
        try:
            if self.rank == 0:
                if done:
                    self.announced = step + 1
                    _set(store, PREFIX + "stop", str(self.announced))
                return self.announced
            if store.check([PREFIX + "stop"]) or done:
                self.announced = int(self._get(store, "stop", STOP_POLL))
        except Exception:
            return None  # not announced yet: ask again at the next step
        return self.announced

    def all_stopped(self) -> bool:
        """Every rank reached its stop (a bounded wait), so none leaves another mid-collective."""
        store = self.store()
        if store is None:
            return True
        try:
            store.add(PREFIX + "stopped", 1)
        except Exception:
            return False
        return self._wait_count("stopped", self.world_size, deadline=WAIT * 3)

    def _wait_count(self, key: str, want: int, *, deadline: float) -> bool:
        store = self.store()
        end = time.monotonic() + deadline
        while time.monotonic() < end:
            try:
                if int(store.add(PREFIX + key, 0)) >= want:
                    return True
            except Exception:
                return False
            time.sleep(0.05)
        self._log(f"not every rank reached the preflight's stop within {deadline:g} s")
        return False

    def _get(self, store: Any, key: str, seconds: float) -> str:
        store.wait([PREFIX + key], datetime.timedelta(seconds=seconds))
        raw = store.get(PREFIX + key)
        return raw.decode() if isinstance(raw, bytes) else str(raw)


def _set(store: Any, key: str, value: str) -> None:
    """Set, and know the store has it: a TCPStore `set` does not wait for the server, a `check` on the same
    connection does (the server answers a connection's requests in order)."""
    store.set(key, value)
    store.check([key])
