"""The stall policy learns from the run itself: startup is generous, the first gap is not learned from.

The stop policy (watchdog/stop.py) is tested here on its own: per-phase limits, the user's limits, and
the proof that a stall cannot end by itself, from stacks built the way the stack reader builds them.
"""

from __future__ import annotations

import threading

import pytest

from trainguard.errors import UserError
from trainguard.watchdog import classify, stop
from trainguard.watchdog.stacks import Frame, ProcSample, Snapshot, ThreadStack
from trainguard.watchdog.stall import StallPolicy


def test_startup_keeps_the_startup_timeout_until_the_first_step() -> None:
    policy = StallPolicy()
    policy.observe(100.0, "train", startup=True)  # probe started, a phase began, no step yet
    assert policy.timeout("train", startup=True) == policy.startup_timeout
    # 75 s after the probe started (a compile, a first batch): not a hang
    assert policy.stalled(175.0, 100.0, 0.0, "train", startup=True) is None
    policy.observe(130.0, None, startup=True)  # a printed banner is a mark, but start-up goes on
    assert policy.timeout(None, startup=True) == policy.startup_timeout


def test_the_first_gap_is_not_learned_from_but_later_ones_are() -> None:
    policy = StallPolicy()
    for t in (0.0, 120.0, 120.5, 121.0, 121.5):  # the first step took 2 minutes (compilation), then 0.5 s
        policy.observe(t, "train")
    assert policy.timeout("train") == policy.min_timeout  # 10 x 0.5 s is below the 60 s floor
    assert policy.first_gap == 120.0
    policy.observe(200.0, "train")  # an 78.5 s gap later in the run is learned
    assert policy.timeout("train") == 785.0


def test_a_fixed_timeout_holds_once_anything_marked_progress() -> None:
    policy = StallPolicy(fixed=4.0)
    assert policy.timeout(None) == 60.0  # before any mark: imports get a floor
    policy.observe(10.0, None, startup=True)  # the probe started
    assert policy.timeout(None, startup=True) == 4.0  # the user's number


def test_a_phase_has_a_pace_of_its_own_from_its_second_gap() -> None:
    policy = StallPolicy()
    for t in (0.0, 1.0, 2.0, 3.0):
        policy.observe(t, None)
    policy.observe(3.5, "eval")  # the way into the first evaluation: not its pace
    assert not policy.has_pace("eval")
    policy.observe(4.0, "eval")
    policy.observe(4.5, "eval")
    assert policy.has_pace("eval")


# -- stop limits ----------------------------------------------------------------------------------------


def test_a_phase_never_seen_gets_the_generous_default() -> None:
    limits = stop.StopLimits()
    assert limits.limit("eval", startup=False, phase_gap=0.0, gaps_seen=False)[0] == stop.NEW_PHASE_LIMIT
    assert limits.limit(None, startup=True, phase_gap=0.0, gaps_seen=False)[0] == stop.NEW_PHASE_LIMIT
    assert stop.NEW_PHASE_LIMIT >= 1800


def test_a_phase_seen_before_gets_a_multiple_of_its_own_longest_never_below_the_floor() -> None:
    limits = stop.StopLimits()
    limits.phase_ended("eval", 400.0)
    limits.phase_ended("eval", 90.0)
    seconds, why = limits.limit("eval", startup=False, phase_gap=3.0, gaps_seen=True)
    assert seconds == stop.LIMIT_FACTOR * 400.0 and "400 s" in why
    limits.phase_ended("save", 20.0)
    assert limits.limit("save", startup=False, phase_gap=0.0, gaps_seen=False)[0] == stop.LIMIT_FLOOR
    # steps outside any phase: their own longest gap
    assert limits.limit(None, startup=False, phase_gap=0.4, gaps_seen=True)[0] == stop.LIMIT_FLOOR


def test_the_users_limits_win_per_phase_then_for_all() -> None:
    limits = stop.StopLimits(user=stop.parse_hang_limits(["900", "eval=7200", "startup=3600"]))
    assert limits.limit("eval", startup=False, phase_gap=0.0, gaps_seen=False)[0] == 7200
    assert limits.limit("save", startup=False, phase_gap=0.0, gaps_seen=False)[0] == 900
    assert limits.limit("eval", startup=True, phase_gap=0.0, gaps_seen=False)[0] == 3600


@pytest.mark.parametrize("bad", ["soon", "-5", "0", "eval=", "=30", "inf", "nan"])
def test_a_bad_hang_limit_is_one_clear_error(bad: str) -> None:
    with pytest.raises(UserError, match="--hang-limit"):
        stop.parse_hang_limits([bad])


# -- proof that a stall cannot end by itself ------------------------------------------------------------

THREADING = threading.__file__


def _thread(*frames: tuple[str, int, str, str | None], main: bool = True, name: str = "MainThread") -> ThreadStack:
    return ThreadStack(ident=name, name=name, main=main,
                       frames=[Frame(file=f, line=n, function=fn, code=c) for f, n, fn, c in frames])


def _diagnose(*procs: ProcSample) -> classify.Diagnosis:
    sample = {p.pid: p for p in procs}
    return classify.diagnose(Snapshot(root_pid=procs[0].pid, samples=[sample, sample], interval=2.0, taken_at=0.0))


def test_a_lock_cycle_is_proof() -> None:
    main = _thread(("/w/train.py", 37, "<module>", "with ckpt_lock:"))
    other = _thread(("/w/train.py", 22, "uploader", "with stats_lock:"), main=False, name="uploader")
    d = _diagnose(ProcSample(pid=10, cpu_percent=0.0, status="sleeping", threads=[main, other]))
    assert d.cause == "deadlock"
    assert stop.proof(d) and stop.proof(d).startswith("lock cycle")


def test_a_lock_wait_with_another_thread_still_running_user_code_is_no_proof() -> None:
    main = _thread(("/w/train.py", 37, "<module>", "with ckpt_lock:"))
    other = _thread(("/w/train.py", 22, "uploader", "with stats_lock:"), main=False, name="uploader")
    busy = _thread(("/w/train.py", 50, "compress", "out = zlib.compress(blob)"), main=False, name="compress")
    d = _diagnose(ProcSample(pid=10, cpu_percent=0.0, status="sleeping", threads=[main, other, busy]))
    assert d.cause == "deadlock" and stop.proof(d) is None


def test_an_event_nothing_can_set_is_proof_but_not_when_a_thread_could() -> None:
    wait = _thread(("/w/train.py", 28, "<module>", "ready.wait()"), (THREADING, 655, "wait", None),
                   (THREADING, 355, "wait", None))
    d = _diagnose(ProcSample(pid=10, cpu_percent=0.0, status="sleeping", threads=[wait]))
    assert d.cause == "deadlock" and "no other thread" in (stop.proof(d) or "")
    setter = _thread(("/w/train.py", 14, "prefetch", "shard = download(url)"), main=False, name="prefetch")
    d = _diagnose(ProcSample(pid=10, cpu_percent=0.0, status="sleeping", threads=[wait, setter]))
    assert stop.proof(d) is None


def test_a_sleep_or_a_file_wait_is_never_proof() -> None:
    sleep = _thread(("/w/train.py", 40, "wait_for_shard", "time.sleep(1.0)"))
    d = _diagnose(ProcSample(pid=10, cpu_percent=0.0, status="sleeping", wchan="hrtimer_nanosleep", threads=[sleep]))
    assert d.cause == "sleep" and stop.proof(d) is None
    fifo = _thread(("/w/train.py", 25, "<module>", "torch.save(state, path)"))
    d = _diagnose(ProcSample(pid=10, cpu_percent=0.0, status="sleeping", wchan="fifo_open", threads=[fifo]))
    assert d.cause == "io" and stop.proof(d) is None


def test_ranks_in_different_collectives_are_proof_a_straggler_is_not() -> None:
    c10d = "/site-packages/torch/distributed/distributed_c10d.py"

    def rank(pid: int, op: str | None, line: int) -> ProcSample:
        frames = [("/w/train.py", line, "main", "dist.all_reduce(t)" if op else "loss = model(x)")]
        if op:
            frames.append((c10d, 2500, op, None))
        return ProcSample(pid=pid, rank=str(pid - 20), cpu_percent=0.0, status="sleeping", threads=[_thread(*frames)])

    d = _diagnose(rank(20, "all_reduce", 43), rank(21, "barrier", 47))
    assert d.cause == "collective" and "different collectives" in (stop.proof(d) or "")
    d = _diagnose(rank(20, "all_reduce", 43), rank(21, None, 30))
    assert d.cause == "collective" and stop.proof(d) is None
    d = _diagnose(rank(20, "all_reduce", 43), rank(21, "all_reduce", 43))
    assert stop.proof(d) is None


def test_a_blocked_dataloader_worker_is_proof() -> None:
    loader = "/site-packages/torch/utils/data/dataloader.py"
    fetch = "/site-packages/torch/utils/data/_utils/fetch.py"
    worker_py = "/site-packages/torch/utils/data/_utils/worker.py"
    main = _thread(("/w/train.py", 36, "<module>", "for x, y in guard.batches(loader):"),
                   (loader, 700, "__next__", None), (loader, 1300, "_next_data", None),
                   (loader, 1250, "_get_data", None), (loader, 1100, "_try_get_data", None))
    worker = ProcSample(pid=11, cmdline=["python", "-c", "from multiprocessing.spawn import spawn_main"],
                        cpu_percent=0.0, status="sleeping",
                        threads=[_thread((worker_py, 300, "_worker_loop", None), (fetch, 52, "fetch", None),
                                         ("/w/train.py", 22, "__getitem__", "threading.Event().wait()"),
                                         (THREADING, 655, "wait", None), (THREADING, 355, "wait", None))])
    d = _diagnose(ProcSample(pid=10, cpu_percent=0.0, status="sleeping", threads=[main]), worker)
    assert d.cause == "dataloader-worker" and "DataLoader worker pid 11" in (stop.proof(d) or "")
    d = _diagnose(ProcSample(pid=10, cpu_percent=0.0, status="sleeping", threads=[main]))
    assert "no DataLoader worker is alive" in (stop.proof(d) or "")


# -- progress the user does not have to write -----------------------------------------------------------


def test_bytes_written_to_a_file_are_progress_but_the_run_folder_is_not(tmp_path) -> None:
    import subprocess
    import sys
    import time

    from trainguard.watchdog.writes import WriteWatch

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    script = (
        "import sys, time\n"
        "store = open(sys.argv[1] + '/run.db-wal', 'wb')\n"  # the probe's store: never progress
        "ckpt = open(sys.argv[2], 'wb')\n"
        "log = open(sys.argv[2] + '.log', 'w')\n"
        "for i in range(60):\n"
        "    store.write(b'x' * 65536); store.flush()\n"
        "    log.write('step %d\\n' % i); log.flush()\n"  # a line now and then: too little to be progress
        "    if i >= 30: ckpt.write(b'y' * (1 << 20)); ckpt.flush()\n"  # a save, in the second half
        "    time.sleep(0.1)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script, str(run_dir), str(tmp_path / "ckpt.pt")])
    try:
        watch = WriteWatch(run_dir, every=0.0)
        seen_early = None
        t0 = time.time()
        while proc.poll() is None:
            last = watch.poll(proc.pid)
            if time.time() - t0 < 2.0:
                seen_early = last
            time.sleep(0.2)
        assert seen_early is None, "writes into the run folder, or a log line, counted as progress"
        assert watch.last_write is not None and watch.last_write - t0 >= 2.5
    finally:
        proc.kill()


def test_a_forward_of_the_watched_model_is_progress(tmp_path) -> None:
    torch = pytest.importorskip("torch")
    import trainguard

    model = torch.nn.Linear(4, 1)
    guard = trainguard.watch(model, torch.optim.SGD(model.parameters(), lr=0.1), run_dir=tmp_path / "run")
    try:
        before = guard.state.ticks  # (progress is counted; the background thread turns a new count into a time)
        with torch.no_grad():
            model(torch.randn(2, 4))  # an evaluation's forward: no step, no batch, no phase
        assert guard.state.ticks > before
    finally:
        guard.finish()


@pytest.mark.parametrize("line,is_loss", [
    ("iter 120: loss 3.2145, time 41.2ms", True), ("{'loss': 2.31, 'learning_rate': 5e-05}", True),
    ("step 10 loss=nan", True), ("Epoch 1: 100%|####| 50/50 [00:01<00:00, loss=0.43]", True),
    ("preparing data (tokenising the corpus) ...", False), ("loading checkpoint from loss_model.pt", False),
])
def test_a_printed_loss_ends_the_start_up_of_a_script_without_the_probe(line: str, is_loss: bool) -> None:
    from trainguard.watchdog.supervisor import _LOSS_LINE

    assert bool(_LOSS_LINE.search(line)) is is_loss


def _look(cause: str, where: str | None, *, written: int = 0, cpu: float = 0.0, read: int = 0):
    from types import SimpleNamespace

    d = classify.Diagnosis(cause=cause, where=where, detail="", fix="")
    return SimpleNamespace(diagnosis=d, io_bytes_moved=written, cpu_percent=cpu, tree_io=(0, read))


def test_the_same_wait_far_longer_than_anything_the_run_did_is_proof() -> None:
    wait = [_look("deadlock", "train.py:40 (<module>)") for _ in range(3)]
    assert stop.stuck(wait, idle=250.0, longest_done=20.0, phase_seen=True) is not None
    assert stop.stuck(wait, idle=150.0, longest_done=20.0, phase_seen=True) is None  # not yet 10x
    assert stop.stuck(wait, idle=100.0, longest_done=0.5, phase_seen=True) is None  # below the floor
    assert stop.stuck(wait, idle=250.0, longest_done=20.0, phase_seen=False) is None  # a phase never seen
    assert stop.stuck(wait[:1], idle=250.0, longest_done=20.0, phase_seen=True) is None  # one look: nothing
    moved = [_look("deadlock", "train.py:40 (<module>)"), _look("deadlock", "train.py:52 (<module>)")]
    assert stop.stuck(moved, idle=250.0, longest_done=20.0, phase_seen=True) is None
    writing = [_look("deadlock", "train.py:40 (<module>)", written=8 << 20) for _ in range(2)]
    assert stop.stuck(writing, idle=250.0, longest_done=20.0, phase_seen=True) is None
    downloading = [_look("deadlock", "train.py:40 (<module>)", read=n << 20) for n in (1, 9)]
    assert stop.stuck(downloading, idle=250.0, longest_done=20.0, phase_seen=True) is None


@pytest.mark.parametrize("cause,cpu", [("busy-loop", 99.0), ("deadlock", 60.0), ("sleep", 0.0), ("io", 0.0),
                                       ("device-sync", 0.0), ("collective", 0.0), ("unknown", 0.0),
                                       ("dataloader-worker", 0.0)])
def test_cpu_burnt_or_a_wait_on_the_world_is_never_stuck_by_persistence(cause: str, cpu: float) -> None:
    # a busy loop and a long native computation look alike: the limit decides, never persistence
    looks = [_look(cause, "train.py:22 (<module>)", cpu=cpu) for _ in range(4)]
    assert stop.stuck(looks, idle=10_000.0, longest_done=1.0, phase_seen=True) is None


AUTOGRAD = "/venv/lib/python3.11/site-packages/torch/autograd/graph.py"


def test_a_wait_inside_backward_is_never_a_self_deadlock() -> None:
    # a DDP rank waiting in its gradient all-reduce (or autograd's engine waiting on its device threads):
    # the main thread sits in a futex under loss.backward() with no other thread in user code; what it
    # waits for is in C++, another rank or another thread of torch's, not a lock of its own
    main = _thread(("/w/train.py", 27, "<module>", "loss.backward()"),
                   ("/venv/lib/python3.11/site-packages/torch/_tensor.py", 623, "backward", None),
                   (AUTOGRAD, 979, "_engine_run_backward", None))
    d = _diagnose(ProcSample(pid=10, cpu_percent=0.0, status="sleeping", wchan="futex_wait_queue", threads=[main],
                             rank="0"))
    assert stop.proof(d) is None


def test_a_rank_its_flight_recorder_shows_in_ddps_all_reduce_is_in_a_collective() -> None:
    c10d = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"
    waiting = _thread(("/w/train.py", 63, "<module>", "dist.all_reduce(mean, group=metrics)"),
                      (c10d, 3245, "all_reduce", None))
    backward = _thread(("/w/train.py", 57, "<module>", "loss.backward()"), (AUTOGRAD, 979, "_engine_run_backward", None))
    procs = [ProcSample(pid=10, cpu_percent=0.0, status="sleeping", threads=[waiting], rank="0"),
             ProcSample(pid=11, cpu_percent=0.0, status="sleeping", wchan="futex_wait_queue", threads=[backward],
                        rank="1")]
    sample = {p.pid: p for p in procs}
    snap = Snapshot(root_pid=10, samples=[sample, sample], interval=2.0, taken_at=0.0)
    d = classify.diagnose(snap, {1: "DDP's gradient all-reduce"})
    assert d.cause == "collective" and "pid 11 (rank 1) waits in DDP's gradient all-reduce" in d.detail
    assert stop.proof(d) is None  # classify leaves the proof to the flight recorders' comparison
    d = classify.diagnose(snap)
    assert "pid 11 (rank 1) is not in a collective" in d.detail


def test_torchruns_agent_in_its_exit_barrier_is_named_when_its_workers_are_done() -> None:
    agent = "/venv/lib/python3.11/site-packages/torch/distributed/elastic/agent/server/api.py"
    barrier = _thread(("/venv/bin/torchrun", 8, "<module>", "sys.exit(main())"),
                      (agent, 938, "_invoke_run", "self._exit_barrier()"),
                      (agent, 994, "_exit_barrier", "store_util.barrier("),
                      ("/venv/lib/python3.11/site-packages/torch/distributed/elastic/utils/store.py", 201, "barrier",
                       "store.wait([last_member_key])"))
    d = _diagnose(ProcSample(pid=10, cpu_percent=0.0, status="sleeping", threads=[barrier]))
    assert d.cause == "exit-barrier" and d.pid == 10 and "_exit_barrier" in (d.where or ""), d
    assert "other nodes' agents" in d.detail and "workers here are done" in d.detail
    assert stop.proof(d) is None  # it ends by itself (the other nodes arrive, or its timeout)
    # while a worker still runs, the agent's wait is not the cause
    worker = _thread(("/w/train.py", 40, "<module>", "loss.backward()"))
    d = _diagnose(ProcSample(pid=10, cpu_percent=0.0, status="sleeping", threads=[barrier]),
                  ProcSample(pid=11, cpu_percent=0.0, status="sleeping", threads=[worker]))
    assert d.cause != "exit-barrier"


TORCH_LINEAR = "/venv/lib/python3.11/site-packages/torch/nn/modules/linear.py"
TORCH_MODULE = "/venv/lib/python3.11/site-packages/torch/nn/modules/module.py"


def test_a_long_evaluation_burning_cpu_inside_torch_is_computing_not_a_busy_loop() -> None:
    # issue 31: a healthy 68 s evaluation (no phase marked) was labelled busy-loop
    main = _thread(("/w/train.py", 52, "evaluate", "out = model(xb)"), (TORCH_MODULE, 1736, "_call_impl", None),
                   (TORCH_LINEAR, 125, "forward", None))
    d = _diagnose(ProcSample(pid=10, cpu_percent=98.0, status="running", threads=[main]))
    assert d.cause == "computing" and d.where == "/w/train.py:52 (evaluate)" and "not a loop that spins" in d.detail
    spin = _thread(("/w/train.py", 30, "<module>", "while not ready: pass"))
    assert _diagnose(ProcSample(pid=10, cpu_percent=98.0, status="running", threads=[spin])).cause == "busy-loop"
