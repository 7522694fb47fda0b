"""The CUDA graph capture gate (probe/capturegate.py): no device work of the probe inside a capture.

This machine has no CUDA, so the real wrapper is put on a stand-in class with CUDAGraph's two methods,
and real threads play the probe's background thread; on a GPU the zoo scenario
`quiet_cuda_graph_capture_cuda` captures real graphs in the default global mode under the guard.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

import trainguard
from trainguard.probe import capturegate
from trainguard.probe.capturegate import GATE, CaptureGate, wrap


def _stand_in(log: list[tuple[str, float]] | None = None, fail_begin: bool = False, fail_end: bool = False) -> type:
    """A class with CUDAGraph's capture methods, recording when the 'capture' is open."""

    class StandIn:
        def capture_begin(self, pool: object = None, capture_error_mode: str = "global") -> None:
            if fail_begin:
                raise RuntimeError("capture_begin failed")
            if log is not None:
                log.append(("begin", time.perf_counter()))

        def capture_end(self) -> None:
            if log is not None:
                log.append(("end", time.perf_counter()))
            if fail_end:
                raise RuntimeError("cudaErrorStreamCaptureInvalidated")

    return StandIn


def _overlaps(gated: bool) -> tuple[int, int, int]:
    """50 captures on this thread while a background thread makes 'device calls' (2 ms each) as the probe
    does; returns (device calls that overlapped a capture, device calls, passes deferred)."""
    gate, log = CaptureGate(), []
    graph_class = _stand_in(log)
    if gated:
        wrap(graph_class, gate)
    stop, calls, deferred = threading.Event(), [], [0]

    def background() -> None:
        while not stop.is_set():
            with gate.device_work() as free:
                if free:
                    t0 = time.perf_counter()
                    time.sleep(0.002)
                    calls.append((t0, time.perf_counter()))
                else:
                    deferred[0] += 1
            time.sleep(0.0005)

    thread = threading.Thread(target=background)
    thread.start()
    try:
        for _ in range(50):
            g = graph_class()
            g.capture_begin()
            time.sleep(0.003)
            g.capture_end()
            time.sleep(0.001)
    finally:
        stop.set()
        thread.join()
    opened = [t for what, t in log if what == "begin"]
    closed = [t for what, t in log if what == "end"]
    windows = list(zip(opened, closed))
    bad = sum(1 for a, b in calls if any(a < e and b > s for s, e in windows))
    assert gate.capturing == 0
    return bad, len(calls), deferred[0]


def test_no_device_call_of_the_background_thread_overlaps_a_capture() -> None:
    bad, calls, deferred = _overlaps(gated=True)
    assert bad == 0 and calls > 0 and deferred > 0, (bad, calls, deferred)


def test_without_the_gate_the_background_calls_do_overlap_captures() -> None:
    # the control: the same threads without the wrapper overlap, so the test above can fail
    bad, calls, _ = _overlaps(gated=False)
    assert bad > 0, (bad, calls)


def test_a_capture_begin_that_raises_leaves_the_gate_open() -> None:
    gate = CaptureGate()
    graph_class = _stand_in(fail_begin=True)
    wrap(graph_class, gate)
    with pytest.raises(RuntimeError, match="capture_begin failed"):
        graph_class().capture_begin()
    assert gate.capturing == 0
    with gate.device_work() as free:
        assert free


def test_a_failed_capture_is_counted_out_and_its_error_reaches_the_user() -> None:
    gate = CaptureGate()
    graph_class = _stand_in(fail_end=True)
    wrap(graph_class, gate)
    g = graph_class()
    g.capture_begin()
    assert gate.capturing == 1
    with gate.device_work() as free:
        assert not free
    with pytest.raises(RuntimeError, match="Invalidated"):
        g.capture_end()
    assert gate.capturing == 0


def test_here_is_the_capturing_thread_only() -> None:
    gate = CaptureGate()
    graph_class = _stand_in()
    wrap(graph_class, gate)
    seen: dict[str, bool] = {}
    opened, release = threading.Event(), threading.Event()

    def capturing() -> None:
        g = graph_class()
        g.capture_begin()
        seen["capturer"] = gate.here()
        opened.set()
        release.wait(5)
        g.capture_end()

    thread = threading.Thread(target=capturing)
    thread.start()
    assert opened.wait(5)
    seen["other"] = gate.here()
    assert gate.capturing == 1
    release.set()
    thread.join()
    assert seen == {"capturer": True, "other": False} and gate.capturing == 0
    graph_class().capture_end()  # an end without a begin (wrapped after it began): nothing goes below zero
    assert gate.capturing == 0


def test_an_error_in_the_gate_never_breaks_the_capture() -> None:
    class BrokenLock:
        def acquire(self, timeout: float = -1) -> bool:
            raise OSError("lock broken")

    gate = CaptureGate()
    gate.lock = BrokenLock()  # type: ignore[assignment]
    log: list[tuple[str, float]] = []
    graph_class = _stand_in(log)
    wrap(graph_class, gate)
    g = graph_class()
    g.capture_begin()
    g.capture_end()
    assert [what for what, _ in log] == ["begin", "end"]
    assert gate.errors and "lock broken" in gate.errors[0]


def test_the_guard_records_nothing_inside_a_capture(tmp_path: Path) -> None:
    """A training step captured as a graph is recorded, not taken: the guard's hooks and guard.step do
    nothing while this thread captures, and count again once it ended."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    guard = trainguard.watch(model, opt, total_steps=10, run_dir=tmp_path / "run")
    graph_class = _stand_in()
    wrap(graph_class, GATE)  # the probe's own gate: its hooks read it
    x, y = torch.randn(4, 8), torch.randn(4, 1)

    def train_step() -> torch.Tensor:
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        guard.step(loss)
        return loss

    train_step()
    assert (guard.micro, guard.opt_steps) == (1, 1)
    g = graph_class()
    g.capture_begin()
    try:
        train_step()
        assert (guard.micro, guard.opt_steps) == (1, 1)
    finally:
        g.capture_end()
    assert GATE.capturing == 0
    train_step()
    assert (guard.micro, guard.opt_steps) == (2, 2)
    guard.finish()
    log = (tmp_path / "run" / "guard.log").read_text() if (tmp_path / "run" / "guard.log").exists() else ""
    assert "guard.step called inside a CUDA graph capture" in log


def test_install_wraps_torch_once_and_can_be_switched_off() -> None:
    assert capturegate.install() and capturegate.install()
    begin = torch.cuda.CUDAGraph.capture_begin
    assert begin.__wrapped__ is not None and not hasattr(begin.__wrapped__, "__wrapped__")
    code = ("import sys, torch; from trainguard.probe import capturegate as c; "
            "sys.exit(0 if not c.install() and not hasattr(torch.cuda.CUDAGraph.capture_begin, '__wrapped__') else 1)")
    env = {**os.environ, "TRAINGUARD_CAPTURE_GATE": "0"}
    assert subprocess.run([sys.executable, "-c", code], env=env, timeout=120).returncode == 0


def test_the_background_thread_defers_its_drain_while_a_capture_is_open(tmp_path: Path) -> None:
    """Steps taken while another thread captures are drained only once the capture ended; none is lost."""
    from trainguard.store.reader import RunReader

    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    guard = trainguard.watch(model, opt, total_steps=40, run_dir=tmp_path / "run")
    graph_class = _stand_in()
    wrap(graph_class, GATE)
    opened, release = threading.Event(), threading.Event()

    def capturing() -> None:  # a capture on another thread: this thread's steps still count
        g = graph_class()
        g.capture_begin()
        opened.set()
        release.wait(10)
        g.capture_end()

    def rows() -> int:
        with RunReader(guard.run_dir) as reader:
            return len(list(reader.steps()))

    thread = threading.Thread(target=capturing)
    thread.start()
    try:
        assert opened.wait(5)
        for _ in range(20):
            opt.zero_grad()
            loss = model(torch.randn(8, 4)).pow(2).mean()
            loss.backward()
            opt.step()
            guard.step(loss)
        time.sleep(1.2)  # two flushes: each finds the capture open and defers
        assert guard.step_count == 20 and rows() == 0
    finally:
        release.set()
        thread.join()
    deadline = time.time() + 10
    while rows() < 19 and time.time() < deadline:  # the last step waits for the next one, or finish()
        time.sleep(0.1)
    assert rows() >= 19
    guard.finish()
    assert rows() == 20
