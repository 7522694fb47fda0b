"""The preflight's shared decisions (probe/lockstep.py) over a real TCPStore, the store torchrun's rendezvous
makes. The whole path, `trainguard preflight -- torchrun --nproc_per_node=2 ...`, is the zoo's
preflight_torchrun_ddp (every rank forced the same paths and stopped at the same step)."""

from __future__ import annotations

import datetime
import threading

import pytest

from trainguard.probe import lockstep
from trainguard.probe.lockstep import Lockstep


@pytest.fixture()
def store():
    from torch.distributed import TCPStore

    master = TCPStore("127.0.0.1", 0, world_size=None, is_master=True, timeout=datetime.timedelta(seconds=30),
                      wait_for_workers=False)
    return master, _client(master.port)


def _client(port: int):
    from torch.distributed import TCPStore

    # each rank is a process of its own with its own connection (one socket cannot wait and set at once)
    return TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=30))


def test_every_rank_gets_rank_0s_answer_even_when_its_own_differs(store) -> None:
    lead, follower = Lockstep(0, 2, store[0]), Lockstep(1, 2, store[1])
    got: list[bool] = []
    t = threading.Thread(target=lambda: got.append(follower.decide("due/eval/4/4", False)))
    t.start()  # the follower waits for rank 0's answer
    assert lead.decide("due/eval/4/4", True) is True
    t.join(10)
    assert got == [True]


def test_a_follower_decides_alone_when_rank_0_never_asks_and_says_so(store, monkeypatch) -> None:
    monkeypatch.setattr(lockstep, "WAIT", 0.3)
    said: list[str] = []
    follower = Lockstep(1, 2, store[1], log=said.append)
    assert follower.decide("due/only-on-rank-1/4/4", True) is True
    assert said and "decided alone" in said[0]


def test_the_stop_is_announced_a_step_ahead_and_every_rank_meets_there(store) -> None:
    lead, follower = Lockstep(0, 2, store[0]), Lockstep(1, 2, store[1])
    assert follower.stop_step(6, False) is None  # nothing announced, not done itself: go on
    assert lead.stop_step(6, True) == 7  # done after step 6: every rank stops after step 7
    assert follower.stop_step(6, False) == 7
    met: list[bool] = []
    t = threading.Thread(target=lambda: met.append(follower.all_stopped()))
    t.start()
    assert lead.all_stopped() is True
    t.join(10)
    assert met == [True]


def test_one_process_decides_alone_without_a_store() -> None:
    solo = Lockstep(0, 1)
    assert solo.decide("due/eval/4/4", True) is True
    assert solo.stop_step(5, True) == 5 and solo.all_stopped()
